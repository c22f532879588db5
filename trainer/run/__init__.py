"""A training run that survives: its state, its checkpoints, and what stops or resumes it.

One room because each module answers "what happens when this run is interrupted?": the state a phase
takes (``state.py``), what a checkpoint holds of it (``checkpoint.py``), the one resume decision for all
ranks (``resume.py``), SIGTERM turned into a checkpoint (``preemption.py``), a dead or frozen peer noticed
in a minute (``watchdog.py``), and when the process started (``clock.py``, for time to the first step).
``trainer/train.py`` runs the phases; this package is what they stand on.
"""
