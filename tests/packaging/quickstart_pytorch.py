"""README's PyTorch quickstart, verbatim (the ```python block after "**PyTorch**" under
"## Quickstart"): keep the two the same.

tests/packaging/test_wheel_install.py runs this file in a fresh virtual environment that holds
only the installed wheel and what ``mltrace[pytorch]`` requires; the trial goes to runs/pytorch
under the working directory.
"""

# README's lines as they are: no blank line between torch and mltrace, an unused loop variable
# ruff: noqa: I001, B007
import torch
import mltrace.pytorch as smd
from mltrace.trials import create_trial

model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

hook = smd.Hook(out_dir="runs/pytorch", save_config=smd.SaveConfig(save_interval=10),
                include_collections=["weights", "gradients", "losses"])
hook.register_module(model)   # parameters, gradients, module inputs/outputs
hook.register_loss(loss_fn)   # saved as MSELoss_output_0 in collection "losses"
for step in range(50):        # your loop, unchanged
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
hook.close()

trial = create_trial("runs/pytorch")
print(trial.steps())                                   # [0, 10, 20, 30, 40]
print(trial.tensor_names(collection="gradients"))
print(trial.tensor("gradient/Sequential_0.weight").reduction_value(40, "l2"))
print(trial.tensor("MSELoss_output_0").value(40))
