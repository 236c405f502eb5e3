"""MalleTrain: elastic DNN training on the nodes a batch scheduler leaves idle."""

__version__ = "0.2.0"
