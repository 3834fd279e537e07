# Shared by the scripts that install Python packages from PyPI. Source it; it defines one
# function.
#
# venv_install VENV REQUIREMENTS LABEL: makes VENV hold exactly the pinned REQUIREMENTS,
# reusing it while that file is unchanged. Installs with uv (pinned; several times faster than
# pip, and it downloads in parallel), falling back to pip when uv cannot be had. Every
# download is cached in .venv/cache inside the clone, shared by all the venvs (they pin many
# of the same packages), never in $HOME.
venv_install() {
    local venv="$1" requirements="$2" label="$3" t0=$SECONDS
    local root lock
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    # One install of a venv at a time: CI installs them all in the background while it
    # compiles, and a stage that needs one meanwhile waits for it here.
    mkdir -p "$(dirname "$venv")"
    exec {lock}>"$venv.lock"
    if ! flock -n "$lock"; then
        echo "== $label: waiting for the install under way (CI: target/ci-prefetch.log)"
        flock "$lock"
    fi
    if cmp -s "$requirements" "$venv/.requirements.txt"; then
        echo "== $label: reusing $venv (ready after $((SECONDS - t0)) s)"
        exec {lock}>&-
        return
    fi
    echo "== $label: installing into $venv"
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    local pip=(env PIP_CACHE_DIR="$root/.venv/cache/pip" "$venv/bin/pip" install --quiet
        --disable-pip-version-check)
    if "${pip[@]}" uv==0.13.9; then
        UV_CACHE_DIR="$root/.venv/cache/uv" "$venv/bin/uv" pip install --quiet \
            --python "$venv/bin/python" --compile-bytecode -r "$requirements"
    else
        "${pip[@]}" --prefer-binary -r "$requirements"
    fi
    cp "$requirements" "$venv/.requirements.txt"
    exec {lock}>&-
    echo "== $label: installed in $((SECONDS - t0)) s"
}
