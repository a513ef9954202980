"""An engine process tunes its garbage collector once: start-up objects frozen, young collections rarer."""
import subprocess
import sys

from django.conf import settings

PROBE = """
import gc, django
django.setup()
from consumers.engine import gc_tuning
before = gc.get_freeze_count()
gc_tuning.tune_for_engine()
print(before, gc.get_freeze_count() > 1000, gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD)
"""


def test_tuning_freezes_what_start_up_built_and_raises_the_young_threshold():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["0", "True", "True"]

