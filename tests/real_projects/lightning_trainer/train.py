"""Fit a small regressor with PyTorch Lightning; checkpoints every few steps into checkpoints/."""
import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, step_sleep=0.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        print(f"global_step={self.global_step} loss={loss.item():.4f}")
        time.sleep(self.hparams.step_sleep)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--every_n_steps", type=int, default=100)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--ckpt_path", default=None, help='a checkpoint to resume from, or "last"')
    args = parser.parse_args()

    L.seed_everything(0)
    x = torch.randn(4096, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    checkpoints = ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=args.every_n_steps, save_top_k=-1,
                                  save_last=True)
    trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, callbacks=[checkpoints],
                        enable_progress_bar=False, log_every_n_steps=10)
    trainer.fit(Regressor(args.step_sleep), loader, ckpt_path=args.ckpt_path)
    print(f"done at global_step={trainer.global_step}")


if __name__ == "__main__":
    main()
