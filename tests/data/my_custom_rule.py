# Seed 001's custom rule file, as a user would keep it (only the import changed).
from mltrace.rules import Rule


class CustomGradientRule(Rule):
    def __init__(self, base_trial, threshold=10.0):
        super().__init__(base_trial, other_trials=None)
        self.threshold = float(threshold)

    def set_required_tensors(self, step):
        for tname in self.base_trial.tensors_in_collection('gradients'):
            self.req_tensors.add(tname, steps=[step])

    def invoke_at_step(self, step):
        for tensor in self.req_tensors.get():
            abs_mean = tensor.reduction_value(step, 'mean', abs=True)
            if abs_mean > self.threshold:
                return True
        return False
