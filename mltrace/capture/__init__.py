"""The capture core: the framework-neutral parts a hook is made of.

``mltrace.capture.hook.Hook`` composes them; each is small enough to read on its own:

- ``options.HookOptions``: the hook's settings, validated once.
- ``adapter.Adapter``: what a framework supplies (worker identity, host copies and reductions of
  its tensors, events at step boundaries); every adapter implements it and overrides nothing else.
- ``clock.StepClock``: the global step, the mode and each mode's step.
- ``plan.SavePlan``: which collections are saved, which tensor belongs to which, what is due.
- ``nan_watch.NanWatch``: tensors held back until a NaN shows up in a watched one.
- ``outputs.Outputs``: the trial writer, the TensorBoard export and the tracking sinks.
- ``nonfinite_warning.NonFiniteWarning``: the log's one warning when a saved value is NaN or infinite.
- ``stop.StopSignal``: a rule's request to stop training.
- ``quiet.QuietLane``: the part of ``Hook`` that takes a quiet step's boundary in one call (``Hook.take_quiet_step``).
- ``errors.ErrorPolicy`` and ``errors.guarded``: an internal error disables the hook, never training.
"""
