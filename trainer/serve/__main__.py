"""``python -m trainer.serve URI``: the predictor (trainer/serve/predictor.py)."""

import sys

from trainer.serve.predictor import main

sys.exit(main())
