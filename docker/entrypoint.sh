#!/bin/sh
# Container entrypoint for the pactrain_hvd images: give this container its own SSH host keys
# (the images ship none, so no two containers share a host key), then run the command.
# Workers of a multi-host run start `/usr/sbin/sshd -D`; the launcher runs horovodrun.
set -e
ssh-keygen -A >/dev/null
exec "$@"
