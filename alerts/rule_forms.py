"""The operator's form for alert rules: the same rules the evaluation reads, checked before saving."""
from django import forms
from django.core.exceptions import ValidationError

from alerts.channels import email
from alerts.models import THRESHOLD_KINDS, AlertRule, RuleKind
from consumers.models import Status


class AlertRuleForm(forms.ModelForm):
    class Meta:
        model = AlertRule
        fields = ["name", "kind", "pipeline", "threshold", "interval_seconds", "statuses", "recipients",
                  "reminder_seconds", "enabled"]
        widgets = {"recipients": forms.TextInput()}

    def clean_recipients(self):
        text = self.cleaned_data.get("recipients", "")
        for address in [a.strip() for a in text.replace(";", ",").split(",") if a.strip()]:
            if problem := email.address_problem(address):
                raise ValidationError(problem)
        return text

    def clean_statuses(self):
        wanted = [s.strip().upper() for s in (self.cleaned_data.get("statuses") or "").split(",") if s.strip()]
        unknown = [s for s in wanted if s not in Status.values]
        if unknown:
            raise ValidationError(f"Unknown status {', '.join(unknown)}: use {', '.join(Status.values)}.")
        return ",".join(wanted)

    def clean(self):
        cleaned = super().clean()
        kind, threshold = cleaned.get("kind"), cleaned.get("threshold")
        if kind in THRESHOLD_KINDS and threshold is None:
            self.add_error("threshold", "This kind of rule compares with a threshold: give N.")
        if threshold is not None and threshold < 0:
            self.add_error("threshold", "The threshold is 0 or more.")
        if kind == RuleKind.DEAD_LETTERS and cleaned.get("interval_seconds") == 0:   # an empty window counts none
            self.add_error("interval_seconds", "Dead letters are counted over a window of 1 second or more.")
        return cleaned
