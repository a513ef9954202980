"""What docs/watch.md and the README promise about a watch's check answers is what the API's schema declares: a
field the API answers and no document names would surprise whoever scripts against the documented shape."""
import json
import re
from pathlib import Path

from dashboard.api.schemas import WatchCheckSerializer

ROOT = Path(__file__).resolve().parent.parent


def cli_check_keys() -> set[str]:
    """The keys of docs/watch.md's "`watch check --json` prints exactly" block."""
    text = (ROOT / "docs" / "watch.md").read_text()
    block = re.search(r"`watch check --json` prints exactly:\n\n```json\n(.*?)```", text, re.S).group(1)
    return set(json.loads(block.replace(", ...", "")))   # the block elides the rest of a list with "..."


def api_check_row() -> str:
    readme = (ROOT / "README.md").read_text()
    return next(line for line in readme.splitlines() if line.startswith("| `POST /api/watches/NAME/check`"))


def test_the_api_check_answers_the_documented_fields_and_the_readme_names_the_rest():
    answered = set(WatchCheckSerializer().fields)
    assert cli_check_keys() <= answered
    named_in_row = set(re.findall(r"`(\w+)`", api_check_row()))
    assert answered - cli_check_keys() <= named_in_row, answered - cli_check_keys() - named_in_row
