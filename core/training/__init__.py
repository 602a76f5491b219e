"""Training self-drafters (core/engine/adapters) from the target's own outputs.

- `data.py`: the target's answers to a workload's prompts (generated with the engine) and
  their frozen features;
- `adapter.py`: KL(full || draft) training of an early-exit adapter and held-out agreement;
- `head.py`: the same for the feature head;
- `calibration.py`: a workload's prompts -> a trained, measured, stored drafter
  (`applespec calibrate`);
- `online.py`: the learner that trains the serving drafter while a job runs, handed to
  the engine as its `learner` (core/engine/learner.py).

The engine imports nothing from here.
"""
