"""A small transformer, a fault injected mid-run, and what mltrace shows about it.

``scripts/demo.sh`` runs this file. It trains a nanoGPT-style character-level transformer (3
pre-LN blocks, width 64, causal self-attention through ``scaled_dot_product_attention``, a GELU
MLP, the head tied to the token embedding) on a few paragraphs of *Alice's Adventures in
Wonderland* (public domain), on the CPU, for a few hundred steps, with ``mltrace.pytorch.Hook``
saving weights, biases, gradients (reductions) and the loss, its flight recorder on, TensorBoard
export on and MLflow logging to SQLite (``./demo-output/mlflow.db``).

At a fixed step it corrupts one layer: the query/key/value projection of block 1 is multiplied by
1e20, as a broken update or a flipped exponent bit would. The attention scores overflow float32,
the softmax turns them into NaN and the loss goes NaN. Then it prints what was injected, what the
flight recorder dumped (read back with ``trial.flight_records()`` and ``trial.first_nonfinite()``),
what each built-in rule found (each an MLflow run nested under the training run) and the
commands that open TensorBoard and MLflow on the run.

Example:
    .venv/bin/python examples/transformer_demo.py --out-dir ./demo-output/transformer
    .venv/bin/python examples/transformer_demo.py --steps 60 --fault-step 40   # quicker
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
import time

import torch
import torch.nn.functional as F
from torch import nn

import mltrace.pytorch as smd
from mltrace.exceptions import MltraceError, NoMoreData
from mltrace.rules import invoke_rule
from mltrace.rules.builtin import rule_class
from mltrace.trials import create_trial
from mltrace_mlflow import links

TEXT = """\
Alice was beginning to get very tired of sitting by her sister on the bank, and of having
nothing to do: once or twice she had peeped into the book her sister was reading, but it had no
pictures or conversations in it, "and what is the use of a book," thought Alice "without
pictures or conversations?"
So she was considering in her own mind (as well as she could, for the hot day made her feel
very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth the trouble
of getting up and picking the daisies, when suddenly a White Rabbit with pink eyes ran close by
her.
There was nothing so very remarkable in that; nor did Alice think it so very much out of the way
to hear the Rabbit say to itself, "Oh dear! Oh dear! I shall be late!" (when she thought it over
afterwards, it occurred to her that she ought to have wondered at this, but at the time it all
seemed quite natural); but when the Rabbit actually took a watch out of its waistcoat-pocket,
and looked at it, and then hurried on, Alice started to her feet, for it flashed across her mind
that she had never before seen a rabbit with either a waistcoat-pocket, or a watch to take out
of it, and burning with curiosity, she ran across the field after it, and fortunately was just
in time to see it pop down a large rabbit-hole under the hedge.
In another moment down went Alice after it, never once considering how in the world she was to
get out again.
"""

WIDTH, HEADS, BLOCKS, CONTEXT, BATCH = 64, 4, 3, 64, 16
#: The fault: this parameter is multiplied by FAULT_FACTOR before the forward pass of the fault
#: step. Its queries and keys grow 1e20-fold, their dot products overflow float32 to +-inf, and
#: softmax(inf - inf) is NaN: the attention output of block 1 is the first NaN of the step.
FAULT_LAYER = "blocks.1.attn.qkv"
FAULT_FACTOR = 1e20
#: Steps run after the first non-finite loss before the loop stops (below).
STEPS_AFTER_NAN = 5
SAVE_INTERVAL = 10
#: Run over the finished trial, each an MLflow run: (name, parameters). NaNInfDetected reads the
#: nan_count/inf_count reductions of every tensor (the hook's saved steps and the recorder's
#: dumped ones), ExplodingTensor the loss; VanishingGradient checks that the gradients were
#: healthy before the fault.
RULES = [
    ("NaNInfDetected", {}),
    ("ExplodingTensor", {"collection_names": "losses"}),
    ("VanishingGradient", {}),
]
MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui --port 5000` serves, as printed
LOG_LEVEL_VARIABLES = ("MLTRACE_LOG_LEVEL", "SMDEBUG_LOG_LEVEL", "TORNASOLE_LOG_LEVEL")


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.gelu, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(WIDTH), SelfAttention()
        self.ln2, self.mlp = nn.LayerNorm(WIDTH), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def batches(generator: torch.Generator):
    """Random windows of the text, as (input, next character) index tensors, forever."""
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    while True:
        start = torch.randint(len(data) - CONTEXT - 1, (BATCH,), generator=generator)
        window = torch.stack([data[s:s + CONTEXT + 1] for s in start.tolist()])
        yield window[:, :-1], window[:, 1:]


def create_hook(out_dir: str, tracking_uri: str) -> smd.Hook:
    """The hook: weights and biases saved raw, gradients as reductions (nan_count for the rules,
    l2 for the TensorBoard tab), the loss every step; the flight recorder keeps the last 50 steps
    of those and of the blocks' attention and MLP outputs (a few reductions each, in memory),
    dumps on a NaN or an infinity or a loss spike (its defaults), then writes the STEPS_AFTER_NAN
    steps after it in full."""
    # The outputs of each block's attention and MLP go to the recorder only (the hook does not
    # save this collection); a collection the recorder names must exist before the hook is built.
    smd.get_collection("activations").include(r"^blocks\.\d+\.(attn|mlp)_output_0$")
    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=SAVE_INTERVAL),
        include_collections=["weights", "biases", "gradients", "losses"],
        export_tensorboard=True,
        mlflow={"tracking_uri": tracking_uri, "experiment": "mltrace-transformer-demo",
                "run_name": "tinygpt-fault"},
        flight_recorder=smd.FlightRecorderConfig(
            steps=50, after_steps=STEPS_AFTER_NAN,
            collections=["weights", "biases", "gradients", "activations", "losses"],
            # min and max (the non-finite check), l2 for the TensorBoard tab's Overview, the
            # counts for NaNInfDetected: each one kernel per tensor and step
            reductions=["min", "max", "l2", "nan_count", "inf_count"]),
    )
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["mean", "std", "nan_count", "inf_count"], abs_reductions=["mean"],
        norms=["l2"])
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=1)
    return hook


def train(out_dir: str, steps: int, fault_step: int, tracking_uri: str) -> tuple[str, str, int]:
    """Train with the hook; corrupt FAULT_LAYER at ``fault_step``. Returns the MLflow (experiment
    id, run id) of the training run and the number of steps run."""
    if "OMP_NUM_THREADS" not in os.environ:  # the user's choice wins
        # A model this small gains nothing from intra-op threads, and on a machine with few
        # cores their spinning competes with the hook's writer and MLflow's helper process
        # (measured on 2 cores: a step 10-20 times slower).
        torch.set_num_threads(1)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    data = batches(generator)
    model = TinyGPT(vocab=len(set(TEXT)))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    hook = create_hook(out_dir, tracking_uri)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(smd.modes.TRAIN)
    print(f"Training TinyGPT ({sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, "
          f"{BLOCKS} blocks, width {WIDTH}) on {len(TEXT)} characters of Alice in Wonderland, "
          f"{steps} steps, fault at step {fault_step} -> {out_dir}")
    first_nan = None
    step = 0
    for step in range(steps):
        if step == fault_step:
            with torch.no_grad():
                model.get_submodule(FAULT_LAYER).weight.mul_(FAULT_FACTOR)
            print(f"  step {step:>3}  FAULT: {FAULT_LAYER}.weight multiplied by {FAULT_FACTOR:g}")
        x, y = next(data)
        optimizer.zero_grad()
        loss = loss_fn(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step >= fault_step:
            print(f"  step {step:>3}  loss {loss.item():.4f}")
        # A user's NaN guard: stop once the loss is not finite. This one waits STEPS_AFTER_NAN
        # steps first (as a job goes on until someone notices), so that the recorder's steps
        # after the trigger show the NaN spreading: the optimizer step writes NaN into every
        # weight. Going on longer adds nothing: every later step is NaN.
        if first_nan is None and not math.isfinite(loss.item()):
            first_nan = step
        if first_nan is not None and step - first_nan >= STEPS_AFTER_NAN:
            print(f"  stopped: the loss is not finite since step {first_nan}")
            break
    hook.close()
    sink = hook.sinks[0]
    return sink.experiment_id, sink.run_id, step + 1


def flight_recorder_report(trial) -> list[str]:
    """What the flight recorder dumped, read back through the trial API."""
    lines = []
    for record in trial.flight_records():
        for dump in record.dumps:
            before = f"{dump.steps_before[0]}-{dump.steps_before[-1]}" if dump.steps_before else "none"
            after = f"{dump.steps_after[0]}-{dump.steps_after[-1]}" if dump.steps_after else "none"
            lines.append(f"dump at step {dump.step} ({record.worker}), trigger {dump.trigger}: "
                         f"{dump.reason}")
            lines.append(f"  wrote the steps before it ({before}) and after it ({after})")
    if not lines:
        lines.append("no dump")
    first = trial.first_nonfinite()
    if first is not None:
        lines.append(f"first non-finite tensor: {first.tensor} (step {first.step}, {first.phase} "
                     f"pass, tensor #{first.position} of the step)")
        others = [n for n in first.nonfinite_tensors if n != first.tensor]
        if others:
            lines.append(f"  then, in execution order: {', '.join(others[:4])}"
                         + (f" and {len(others) - 4} more" if len(others) > 4 else ""))
    return lines


def run_rules(out_dir: str) -> list[str]:
    """Run built-in rules over the finished trial; each is an MLflow run under the training run."""
    trial = create_trial(out_dir)
    lines = []
    for name, params in RULES:
        rule = rule_class(name)(trial, **params)
        try:
            result = invoke_rule(rule)
        except NoMoreData as exc:
            result = exc.rule_result  # type: ignore[attr-defined]
        found = (f"fired at step {result.fired_steps[0]}: {result.message}" if result.fired_steps
                 else f"nothing ({result.evaluated_steps} steps evaluated)")
        head = f"  {name:<18} {result.status:<14}"
        lines += textwrap.wrap(found, 100, initial_indent=head, subsequent_indent=" " * len(head),
                               max_lines=3, placeholder=" ...")
    return lines


def tool(name: str) -> str:
    """The command ``name`` from this Python's environment, as a short path when it has one."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        return name
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def summary(out_dir: str, fault_step: int, tracking_uri: str, experiment_id: str,
            run_id: str) -> str:
    trial = create_trial(out_dir)
    recorder = "\n".join(f"  {line}" for line in flight_recorder_report(trial))
    rules = "\n".join(run_rules(out_dir))
    return f"""
=== What happened ===
Injected at step {fault_step}: {FAULT_LAYER}.weight x {FAULT_FACTOR:g} (block 1's attention
  query/key/value projection: its attention scores overflow, softmax gives NaN)
Flight recorder (trial.flight_records(), trial.first_nonfinite()):
{recorder}
Rules over the trial (each an MLflow run nested under the training run):
{rules}

=== Where to look ===
TensorBoard:
  {tool("mltrace")} tensorboard {out_dir} --port 6006 --mltrace_mlflow_uri {MLFLOW_UI}
  then http://127.0.0.1:6006, tab "mltrace": Rules (the first non-finite tensor in red, the
  dump, each rule's finding), Overview (gradients, statistic nan_count or l2: the steps from
  {fault_step} on); TensorBoard's Scalars tab has the loss curve.
MLflow:
  {tool("mlflow")} ui --backend-store-uri {tracking_uri} --port 5000
  then the training run "tinygpt-fault": {links.run_url(MLFLOW_UI, experiment_id, run_id)}
  (its description says what the rules found; tags mltrace.first_nonfinite.tensor and .step;
  the rule runs are nested under it, named with their outcome)"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=None,
                        help="where to write the trial (default: ./demo-output/transformer-<time>)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")
    parser.add_argument("--fault-step", type=int, default=None,
                        help="the step the fault is injected at (default: 2/3 of --steps, plus 3: 203)")
    args = parser.parse_args(argv)
    if args.fault_step is None:
        args.fault_step = min(args.steps * 2 // 3 + 3, args.steps - 1)  # 203 of 300: not a saved step
    if not 0 <= args.fault_step < args.steps:
        parser.error(f"--fault-step {args.fault_step} must be within the {args.steps} steps")
    if args.out_dir is None:
        args.out_dir = os.path.join("demo-output", f"transformer-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not any(os.environ.get(v) for v in LOG_LEVEL_VARIABLES):  # the user's choice wins
        logging.getLogger("mltrace").setLevel(logging.WARNING)  # keep the library's INFO lines out
    for noisy in ("mlflow", "alembic"):  # MLflow's database set-up chatter on first use
        logging.getLogger(noisy).setLevel(logging.WARNING)
    out_dir = os.path.abspath(args.out_dir)
    tracking_uri = f"sqlite:///{os.path.join(os.path.dirname(out_dir), 'mlflow.db')}"
    os.environ.setdefault("MLFLOW_TRACKING_URI", tracking_uri)  # rule runs log there too
    tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    started = time.perf_counter()
    try:
        experiment_id, run_id, ran = train(out_dir, args.steps, args.fault_step, tracking_uri)
    except MltraceError as exc:  # e.g. out_dir holds a finished run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Trained {ran} steps in {time.perf_counter() - started:.1f}s; reading the trial back.")
    print(summary(out_dir, args.fault_step, tracking_uri, experiment_id, run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
