"""Imported once by the demo's fork server (consumers/demo/forks.py), before it forks any pipeline process:
Django set up, and the modules a pipeline run needs loaded. Opens no connection and starts no thread."""
import django

django.setup()

import consumers.engine.python  # noqa: E402,F401
import consumers.management.commands.run_pipeline  # noqa: E402,F401
