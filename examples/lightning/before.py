"""A minimal PyTorch Lightning training script (the shape of Lightning's own examples).

    torchrun --nnodes=2 --nproc-per-node=1 ... train.py --num-nodes 2 --epochs 5

--device auto (the default) trains on the GPU (NCCL) when one is visible, else on the CPU
(gloo): Lightning's own choice for accelerator="auto".
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitRegressor(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


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
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--root-dir", default=".")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU when one is visible, else the CPU")
    args = parser.parse_args()

    L.seed_everything(0)
    train_loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator=args.device, devices=1,
                        num_nodes=args.num_nodes, strategy="ddp",
                        default_root_dir=args.root_dir)
    trainer.fit(LitRegressor(lr=args.lr), train_loader)


if __name__ == "__main__":
    main()
