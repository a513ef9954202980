"""Create the dashboard's roles: the groups "viewers" and "operators" with their permissions."""
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from dashboard.roles import OPERATORS, VIEWERS, setup_roles


class Command(BaseCommand):
    help = "Create or update the groups 'viewers' and 'operators'; optionally put users in them."

    def add_arguments(self, parser):
        parser.add_argument("--viewer", action="append", default=[], metavar="USERNAME",
                            help="Add this user to 'viewers' (repeatable).")
        parser.add_argument("--operator", action="append", default=[], metavar="USERNAME",
                            help="Add this user to 'operators' (repeatable).")

    def handle(self, *args, viewer, operator, **options):
        counts = setup_roles()
        users = get_user_model().objects
        for group_name, usernames in ((VIEWERS, viewer), (OPERATORS, operator)):
            group = Group.objects.get(name=group_name)
            for username in usernames:
                try:
                    users.get(username=username).groups.add(group)
                except users.model.DoesNotExist:
                    raise CommandError(f"No user named {username!r}.") from None
        self.stdout.write(", ".join(f"{name}: {n} permissions" for name, n in counts.items()))
