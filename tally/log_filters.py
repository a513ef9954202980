"""Logging filters for the libraries Tally runs.

kafka-python 3.0 logs `Metadata refresh: failed Cancelled` at ERROR when a client is closed while a metadata
request is in flight: the close cancels it on purpose. Every run that ends cleanly could print it, and an ERROR
line on a clean stop teaches operators to ignore ERROR lines. A refresh that fails for any other reason (a lost
connection, a timeout) carries another exception and is still logged.
"""
import logging

from kafka.errors import Cancelled


class DropCancelledMetadataRefresh(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        cancelled = isinstance(record.args, tuple) and any(isinstance(arg, Cancelled) for arg in record.args)
        return not (cancelled and record.msg.startswith("Metadata refresh: failed"))
