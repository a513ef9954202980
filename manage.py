#!/usr/bin/env python
"""Django's command-line utility for Tally."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
    # A checkout's command line is the developer stack (no SECRET_KEY needed); the Docker image sets
    # TALLY_DEVELOPMENT=0, so its commands run as production (see docs/security.md).
    os.environ.setdefault("TALLY_DEVELOPMENT", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
