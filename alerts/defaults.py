"""The global rules every installation starts with: silence about lost data is the one thing not allowed.
Lag thresholds depend on the deployment, so operators add those themselves."""

DEFAULT_RULES = [
    # (name, kind, threshold)
    ("Lost records", "lost", None),
    ("Duplicated records", "duplicated", None),
    ("Phantom rows", "phantom", None),
    ("Ledger gap", "gap", None),
    ("Stalled, stopped or erroring", "status", None),
    ("No live consumer", "no_consumer", None),
    ("Dead letters (over 100 in 5 minutes)", "dead_letters", 100),
]


def ensure_default_rules(rule_model=None) -> int:
    """Create the missing default rules (idempotent); returns how many were created. Takes the model so
    that the data migration can pass its historical one."""
    if rule_model is None:
        from alerts.models import AlertRule as rule_model
    created = 0
    for name, kind, threshold in DEFAULT_RULES:
        created += rule_model.objects.get_or_create(name=name, kind=kind, pipeline=None,
                                                    defaults={"threshold": threshold})[1]
    return created
