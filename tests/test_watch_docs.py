"""What docs/watch.md promises about a watch's check answers is what the API's schema declares: a
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


def test_the_api_check_answers_the_documented_fields_exactly():
    """The API answers the report `watch check --json` prints (WatchReport.as_json): one documented shape."""
    assert set(WatchCheckSerializer().fields) == cli_check_keys()
