"""The web container's health check (docker-compose.yml, docker-compose.external.yml):
`python -m tally.healthcheck [URL]` asks gunicorn for the login page as the TLS proxy in front would, and exits
non-zero unless it answers 2xx.

The Host header must be one Django accepts, or every check is a 400 (DisallowedHost): it is taken from
ALLOWED_HOSTS, which a deployment sets to its own names. No Django import: it runs every few seconds.
"""
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/accounts/login/"


def host_to_ask(allowed_hosts: str) -> str:
    """The first of ALLOWED_HOSTS ("localhost" when unset or "*"; ".example.com" also matches example.com)."""
    first = next((name.strip() for name in allowed_hosts.split(",") if name.strip()), "localhost")
    return "localhost" if first == "*" else first.lstrip(".")


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else DEFAULT_URL
    headers = {"X-Forwarded-Proto": "https", "Host": host_to_ask(os.environ.get("ALLOWED_HOSTS", ""))}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5):
            return 0
    except (urllib.error.URLError, OSError) as exc:   # HTTPError (4xx, 5xx) is a URLError
        print(f"{url} (Host: {headers['Host']}): {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
