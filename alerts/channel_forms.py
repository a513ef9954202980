"""The channel form of the Channels page and the Django admin. Secrets are write-only: their inputs are never
filled in (the page shows the masked value beside them), and an empty input on an edit keeps the saved one, as
long as the channel still sends to the same URL: a routing key or signing secret is never kept for a new URL,
where whoever edits the channel could send it to a host of their own.
Validation is the model's (alerts/channels/<kind>.problems), the same as the command's and the API's."""
from django import forms

from alerts.models import AlertRule, Channel

SECRET_FIELDS = ("url", "routing_key", "secret")


class ChannelForm(forms.ModelForm):
    rules = forms.ModelMultipleChoiceField(
        queryset=AlertRule.objects.select_related("pipeline").order_by("name"), required=False,
        widget=forms.CheckboxSelectMultiple, help_text="None checked: every rule's notifications come here.")

    class Meta:
        model = Channel
        fields = ["name", "kind", "url", "recipients", "routing_key", "secret", "rules", "enabled"]
        labels = {"recipients": "To", "url": "URL"}
        widgets = {
            "url": forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
            "routing_key": forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
            "secret": forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
            "recipients": forms.TextInput(),
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The admin leaves out the fields a user may only view (alerts.admin.ChannelAdmin shows them masked).
        if self.instance.pk and "name" in self.fields:
            self.fields["name"].disabled = True  # the name is how the command and the API find it
        if self.instance.pk:
            shown = self.instance.as_json()
            for field in SECRET_FIELDS:
                saved = shown.get(field) if field != "secret" else ("set" if self.instance.secret else "")
                if saved and field in self.fields:
                    self.fields[field].help_text = f"Saved: {saved}. Leave empty to keep it."

    def _keep(self, field):
        """The new value, or the saved one when left empty on an edit of the same kind and, for the secrets that
        go with a URL, the same URL (a channel that changes kind keeps no secret of its old kind: a webhook's URL
        must not become a PagerDuty endpoint)."""
        value = self.cleaned_data.get(field, "")
        keep = self._same_kind() and (field == "url" or not self._url_changed())
        return value or (getattr(self.instance, field) if keep else "")

    def _same_kind(self) -> bool:
        return bool(self.instance.pk) and self.data.get(self.add_prefix("kind")) == self.instance.kind

    def _url_changed(self) -> bool:
        url = self.data.get(self.add_prefix("url"), "")
        return bool(self.instance.pk) and bool(url) and url != self.instance.url

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk and cleaned.get("kind") != self.instance.kind:
            # Django keeps the saved value of a field left out of the POST: clear the old kind's secrets here.
            for field in SECRET_FIELDS:
                if not cleaned.get(field):
                    setattr(self.instance, field, "")
        elif self._url_changed():
            for field in ("routing_key", "secret"):
                if getattr(self.instance, field) and not cleaned.get(field):
                    self.add_error(field, "The URL changed: enter this again. A saved secret is kept only for "
                                          "the URL it was given with.")
        return cleaned

    def clean_url(self):
        return self._keep("url")

    def clean_routing_key(self):
        return self._keep("routing_key")

    def clean_secret(self):
        return self._keep("secret")
