"""The PyTorch side of the transformer-stability signals (mltrace.stability.signals names them):
what computes each (statistics), where the step keeps them (step_signals), how attention calls
are seen (interception), the optimizer's side (optimizer_signals) and the callbacks that join
them to the hook (probe)."""
