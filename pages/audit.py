"""/audit on a server whose first visitor opened it: hands over to app.py's navigation (see app.py)."""
from pages._common import legacy_entry

legacy_entry()
