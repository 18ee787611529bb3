#!/usr/bin/env bash
# Set-up for the Kafka client tests (tests/kafka) and bench/kafka_bench.py.
# Idempotent: safe to run again; does nothing that is already done.
#
#  - a virtualenv at target/pyenv with pinned pytest, confluent-kafka,
#    kafka-python and the codec packages kafka-python uses for
#    snappy (python-snappy, which is built on cramjam), lz4 (lz4) and
#    zstd (zstandard); gzip is in the standard library. crc32c makes
#    kafka-python's CRC-32C of record batches native instead of pure Python.
#    matplotlib (and its dependencies) draws the fault harness's timeline.png
#    (tests/chaos); fusepy (pure Python over libfuse 2, which the harness
#    installs with apt-get) runs its power-loss file system, lossyfs.
#    schemathesis (with hypothesis and the rest of its dependencies) fuzzes the
#    admin API from its OpenAPI document (tests/kafka/test_openapi_fuzz.py).
#  - kcat (Debian package `kcat`, older releases call it `kafkacat`) through
#    apt-get when it is missing and we are root. If it cannot be had, the
#    tests that need it are skipped and say why (see tests/kafka/conftest.py).
#
# Only PyPI and Debian's package registries are used.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/pyenv
PY=${PYTHON:-python3}

# One pin per line, dependencies included: the stamp below is a hash of this
# list, so changing a pin reinstalls.
REQUIREMENTS="pytest==9.2.0
pytest-timeout==2.4.0
confluent-kafka==2.16.1
kafka-python==3.0.12
python-snappy==0.7.3
cramjam==2.14.0
lz4==4.4.5
zstandard==0.25.0
crc32c==2.9.post0
iniconfig==2.3.1
packaging==26.4
pluggy==1.7.0
Pygments==2.21.0
matplotlib==3.11.2
contourpy==1.3.3
cycler==0.12.1
fonttools==4.68.0
kiwisolver==1.5.1
numpy==2.4.6
pillow==13.0.0
pyparsing==3.3.3
python-dateutil==4.0.0
tzdata==2026.6
fusepy==3.0.1
schemathesis==4.32.5
anyio==4.16.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
graphql-core==3.3.2
harfile==0.6.0
hypothesis==6.170.27
hypothesis-graphql==0.13.5
idna==3.21
jsonschema_rs==0.60.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
pyrate-limiter==4.6.0
PyYAML==6.0.4
requests==2.34.2
rich==15.0.0
sortedcontainers==2.4.0
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9"

stamp_value=$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -d' ' -f1)
stamp_file=$VENV/.strom-requirements.sha256

if [ ! -x "$VENV/bin/python" ]; then
  echo "== python: creating virtualenv $VENV"
  mkdir -p target
  "$PY" -m venv "$VENV"
fi

if [ "$(cat "$stamp_file" 2>/dev/null || true)" != "$stamp_value" ]; then
  echo "== python: installing pinned packages into $VENV"
  req=$(mktemp)
  trap 'rm -f "$req"' EXIT
  printf '%s\n' "$REQUIREMENTS" >"$req"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  echo "$stamp_value" >"$stamp_file"
else
  echo "== python: $VENV is up to date"
fi

# Every pinned module imports, and kafka-python sees every codec.
"$VENV/bin/python" - <<'EOF'
import importlib.util
import confluent_kafka, kafka, matplotlib, pytest
# fusepy loads libfuse 2 when imported: the harness installs that, so only look for it here.
assert importlib.util.find_spec("fuse"), "fusepy is not installed"
assert importlib.util.find_spec("schemathesis"), "schemathesis is not installed"
from kafka import codec
missing = [name for name, ok in [("snappy", codec.has_snappy()), ("lz4", codec.has_lz4()),
                                 ("zstd", codec.has_zstd()), ("gzip", codec.has_gzip())] if not ok]
if missing:
    raise SystemExit(f"kafka-python is missing codecs: {missing}")
print(f"== python: pytest {pytest.__version__}, confluent-kafka {confluent_kafka.__version__} "
      f"(librdkafka {confluent_kafka.libversion()[0]}), kafka-python {kafka.__version__}; "
      "codecs gzip snappy lz4 zstd ok")
EOF

# kcat
if command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1; then
  echo "== kcat: $(command -v kcat || command -v kafkacat)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== kcat: installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq >/dev/null 2>&1 &&
     { apt-get install -y -qq kcat >/dev/null 2>&1 || apt-get install -y -qq kafkacat >/dev/null 2>&1; }; then
    echo "== kcat: $(command -v kcat || command -v kafkacat)"
  else
    echo "== kcat: could not be installed; the kcat tests will be skipped" >&2
  fi
else
  echo "== kcat: not installed and not root (no apt-get); the kcat tests will be skipped" >&2
fi

# The failover demonstrations (deploy/demos) need jq, bc, curl and iproute2 (ip; the
# overload test reads listen queues with ss).
missing=()
for tool in jq bc curl ip ss; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== demos: installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  pkgs=()
  for tool in "${missing[@]}"; do
    case "$tool" in ip | ss) pkgs+=(iproute2) ;; *) pkgs+=("$tool") ;; esac
  done
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq "${pkgs[@]}" >/dev/null 2>&1 || echo "== demos: could not install ${pkgs[*]}; their tests will be skipped" >&2
fi
