# Sourced by the scripts: create .venv and install the package with EXTRAS, once.
#   EXTRAS=dev,postgres,mysql (the default: the test suite's drivers and tools)
#   EXTRAS="" (scripts/demo: the package alone, SQLite; no compiler, no headers)
# A venv that has a superset installed serves a smaller set as it is.
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS-dev,postgres,mysql}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
hash=$(sha1sum < pyproject.toml | cut -c1-12)
if ! ls .venv/.installed-"$hash"-* >/dev/null 2>&1 \
    || ! { [ -z "$EXTRAS" ] || ls .venv/.installed-"$hash"-"$EXTRAS" >/dev/null 2>&1; }; then
    # stamped only once it installed (a caller without set -e goes on after a failure)
    # --no-compile: modules compile as they are imported, not all at install (half its time)
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile \
        -e ".${EXTRAS:+[$EXTRAS]}" \
        || return 1
    rm -f .venv/.installed-*
    touch ".venv/.installed-$hash-$EXTRAS"
fi
