"""The refusal every operation raises (offset moves, rewinds, group resets, dead-letter actions, pipeline actions):
bad input or an unsafe moment, nothing changed. `actions.refuse` records it in the action log first and attaches
that entry (`action_log`), so a door can name it."""


class Refused(Exception):
    """Bad input or an unsafe moment: nothing was changed. The message says why, for the operator."""
