"""A plain DistributedDataParallel script (gloo, CPU) with no mltrace line, for torchrun.

torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each rank trains the same tiny
model on data of its own for ``--steps`` steps and prints its rank and last loss.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(4, 6, generator=generator)
        y = torch.randint(0, 2, (4,), generator=generator)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
    print(f"rank {rank} last loss {loss.item():.4f}", flush=True)  # before gloo's teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
