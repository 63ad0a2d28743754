"""The one-machine launcher: ``streamrec up`` runs every service as a local process and
drives a demo job through the REST API; ``streamrec down`` stops what it started."""
