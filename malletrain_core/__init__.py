"""MalleTrain: elastic DNN training on the nodes a batch scheduler leaves idle."""

__version__ = "0.1.0"
