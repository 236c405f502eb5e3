"""A minimal torchrun DDP training script (the shape of PyTorch's DDP tutorials).

    torchrun --nproc-per-node=2 train.py --epochs 5

--device auto (the default) trains on this process's GPU with NCCL when one is visible, else on
the CPU with gloo.
"""

import argparse
import os

import torch
import torch.distributed as dist
from malletrain_core.worker import elastic
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def make_dataset(n=1003):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, :5].sum(dim=1, keepdim=True) - x[:, 5:].prod(dim=1, keepdim=True)).tanh()
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU when one is visible, else the CPU")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elastic.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ToyModel().to(args.device)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    dataset = make_dataset()
    sampler = elastic.ElasticSampler(dataset, batch_size=args.batch_size)
    run = elastic.Run(ddp_model, optimizer, sampler=sampler)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(sampler.data_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(x.to(args.device)), y.to(args.device))
            loss.backward()
            optimizer.step()
            run.step(loss=loss.item())
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
