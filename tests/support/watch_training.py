"""A training job for the ``mltrace watch`` tests and benchmark: a small PyTorch model trained
with mltrace's hook (out_dir local or s3://, MLflow on), slow enough to be watched while it trains.

    python tests/support/watch_training.py OUT_DIR [--steps 40] [--sleep 0.25] [--vanishing] [--tag k=v]

``--vanishing`` makes a deep sigmoid stack with tiny weights: the first layers' gradients are
far below VanishingGradient's threshold (1e-7) from the first step. MLflow comes from the
environment (MLFLOW_TRACKING_URI), S3 from AWS_*.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import mltrace.pytorch as smd


def model_for(vanishing: bool) -> nn.Module:
    torch.manual_seed(0)
    if not vanishing:
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    layers: list[nn.Module] = []
    for _ in range(8):
        linear = nn.Linear(4, 4)
        nn.init.normal_(linear.weight, std=1e-3)
        layers += [linear, nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(4, 1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.25)
    p.add_argument("--vanishing", action="store_true")
    p.add_argument("--experiment", default="team")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--no-mlflow", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = model_for(args.vanishing)
    tags = dict(t.split("=", 1) for t in args.tag)
    mlflow = False if args.no_mlflow else {"experiment": args.experiment, "tags": tags}
    hook = smd.Hook(out_dir=args.out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "losses"], mlflow=mlflow)
    hook.register_module(model)
    loss_fn = nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        x = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        loss = loss_fn(model(x), x.sum(1, keepdim=True))
        loss.backward()
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
    hook.close()


if __name__ == "__main__":
    main()
