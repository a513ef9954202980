"""The forms of the offset moves (rewinds and consumer-group resets), shared by the dashboard's pages and the
consumers app's admin actions: they live below both apps, so the admin never imports the web app. The rule is
offset_specs.validate, the same the API's serializers and the commands call; a form places its Invalid beside
its field."""
from django import forms

from consumers.form_errors import add_problems
from consumers.operations import offset_specs
from consumers.operations.errors import Invalid
from consumers.operations.offset_specs import MODES_WITH_VALUE, OFFSET_MODES

MODE_HELP = {
    "to-earliest": "the log start (re-read everything still in Kafka)",
    "to-latest": "the high watermark (skip everything not yet read)",
    "to-current": "where it is now (a no-op, useful to preview)",
    "to-offset": "an absolute offset, e.g. 1200",
    "to-datetime": "the first record at or after a time, e.g. 2026-11-22T04:00:00Z",
    "by-duration": "a duration back from now, e.g. PT15M or P1D",
    "shift-by": "relative to now: -100 re-reads 100 records, +100 skips 100",
}
MODE_CHOICES = [(mode, f"{mode} — {MODE_HELP[mode]}") for mode in OFFSET_MODES]


def parse_partitions(text: str) -> list[int]:
    """"0, 2,5" -> [0, 2, 5]; empty -> [] (all partitions)."""
    parts = [part.strip() for part in (text or "").replace(" ", ",").split(",") if part.strip()]
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        raise forms.ValidationError("Partitions are numbers separated by commas, e.g. 0, 2.") from None
    if any(n < 0 for n in numbers):
        raise forms.ValidationError("Partition numbers are 0 or more.")
    return sorted(set(numbers))


class OffsetMoveForm(forms.Form):
    mode = forms.ChoiceField(choices=MODE_CHOICES, initial="to-offset", widget=forms.RadioSelect)
    value = forms.CharField(required=False, max_length=64,
                            help_text="For to-offset, to-datetime, by-duration and shift-by.")
    partitions = forms.CharField(required=False, max_length=500,
                                 help_text="Comma-separated; empty means every partition.")

    def clean_partitions(self):
        return parse_partitions(self.cleaned_data.get("partitions", ""))

    def clean(self):
        cleaned = super().clean()
        mode, value = cleaned.get("mode"), (cleaned.get("value") or "").strip()
        if mode is None:
            return cleaned
        if mode not in MODES_WITH_VALUE:
            value = ""  # a value left in the box from another mode must not make the form fail
        try:
            cleaned["spec"] = offset_specs.validate(mode, value or None)
        except Invalid as exc:
            add_problems(self, exc)
        cleaned["value"] = value
        return cleaned

    def hidden_copy(self) -> dict:
        """The validated input, to carry from the preview to the confirmation step."""
        data = self.cleaned_data
        return {"mode": data["mode"], "value": data["value"],
                "partitions": ",".join(map(str, data["partitions"]))}


class RewindForm(OffsetMoveForm):
    rollback_sink = forms.BooleanField(
        required=False, label="Roll back the sink",
        help_text="Delete the sink rows at or beyond the new offset in the same transaction. Without it an "
                  "exactly-once pipeline re-inserts replayed rows idempotently.")


class GroupResetForm(OffsetMoveForm):
    topic = forms.CharField(max_length=249)

    def __init__(self, *args, topics=(), **kwargs):
        super().__init__(*args, **kwargs)
        if topics:
            self.fields["topic"] = forms.ChoiceField(choices=[(t, t) for t in topics])

    def hidden_copy(self) -> dict:
        return {**super().hidden_copy(), "topic": self.cleaned_data["topic"]}
