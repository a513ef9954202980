"""text/csv for the API's one CSV answer (a watch's findings). DRF turns an `Accept: text/csv` away with 406 before
a view runs unless one of its renderers names that type, so the answer its schema documents could not be asked
for by that name."""
import csv
import io

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        """The view streams its own CSV; what reaches here is a refusal (403, 404, 429 ...): its fields as one
        CSV row under a header row."""
        if data is None:
            return b""
        if not isinstance(data, dict):
            return str(data).encode()
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(data.keys())
        writer.writerow(str(value) for value in data.values())
        return out.getvalue().encode()
