# Sourced by the scripts: create .venv and install the package with its extras, once.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,postgres,mysql]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
