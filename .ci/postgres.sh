#!/usr/bin/env bash
# Start a throwaway PostgreSQL on 127.0.0.1 for the distributed-storage tests; prints the URL.
set -euo pipefail
port=${PORTKERN_PG_PORT:-54329}
# a port something already listens on (an earlier run's server) moves us to the next one
while (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port + 1)); done
dir=$(mktemp -d /tmp/portkern-pg.XXXXXX)
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
  apt-get update -qq >/dev/null && apt-get install -y -qq postgresql >/dev/null
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
run "$bin/initdb -D $dir/data -A trust -U postgres" >/dev/null
run "$bin/pg_ctl -D $dir/data -o '-k $dir -p $port -h 127.0.0.1' -l $dir/log -w start" >/dev/null
echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
