"""A minimal Hugging Face Trainer script (the shape of the Trainer's own examples): a tiny
GPT-2, randomly initialised from a local config (nothing downloaded), learns sequences that
count up modulo the vocabulary.

    torchrun --nproc-per-node=2 train.py --output-dir out --epochs 3

--device auto (the default) trains on the GPU (NCCL) when one is visible, else on the CPU
(gloo; without a GPU the Trainer must be told use_cpu, or under torchrun each process
trains alone).
"""

import argparse

import torch
from malletrain_core.worker import hf as mt
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, n=1003, length=16, vocab=32):
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default="out")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU when one is visible, else the CPU")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this process sees no GPU")

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=mt.accumulation(global_batch=48, per_device=args.batch_size),
        num_train_epochs=args.epochs,
        learning_rate=3e-3,
        logging_steps=10,
        save_steps=200,
        report_to="none",
        use_cpu=args.device == "cpu" or not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=CountingDataset(),
                      callbacks=[mt.MalleTrainCallback()])
    mt.train(trainer, resume_from_checkpoint=mt.last_checkpoint(args.output_dir))


if __name__ == "__main__":
    main()
