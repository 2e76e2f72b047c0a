#!/usr/bin/env bash
# Sets up a lent GPU machine (its python3 holds a CUDA torch; no package index) for gpu_check.sh, from
# files carried beside the tree in .whl/ (ignored by git): the wheels it lacks (mpich, mpi4py, simplejpeg,
# zarr and its numcodecs, donfig and google-crc32c, zlib-ng, mfusepy, setuptools), downloaded here for its Python 3.12 with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... -d .whl
# and libjpeg's Debian packages (`apt-get download libjpeg62-turbo libjpeg62-turbo-dev`, renamed *.deb),
# unpacked under /tmp/jpeg where the machine has no libjpeg headers, so that the partial-decode extension
# dstore.codec._jpegcrop builds and loads there too.
# Source it (it exports LD_LIBRARY_PATH for the extension):   . tools/measure/gpu_setup.sh .whl
W=${1:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$W"/*.whl || return 1 2>/dev/null || exit 1
rm -f datastore/codec/_jpegcrop*.so  # built again here, against this machine's libjpeg
if [ -f /usr/include/jpeglib.h ]; then
    # the machine's own libjpeg headers: build against them. Never mix: the carried headers with this
    # machine's jconfig.h (libjpeg 8's, found first in /usr/include/x86_64-linux-gnu) built an extension
    # that crashed in its first decode (seen on the H200 machine, 2026-12-04)
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING" | tail -5
else
    mkdir -p /tmp/jpeg && for f in "$W"/*.deb; do dpkg -x "$f" /tmp/jpeg; done
    export LD_LIBRARY_PATH=/tmp/jpeg/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    CFLAGS="-I/tmp/jpeg/usr/include -I/tmp/jpeg/usr/include/x86_64-linux-gnu" LDFLAGS=-L/tmp/jpeg/usr/lib/x86_64-linux-gnu \
        python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING" | tail -5
fi
python3 -c "import dstore, mpi4py, simplejpeg, zarr; from dstore.codec import decode; \
print('dstore', dstore.__version__, 'partial decode extension:', decode._jpegcrop is not None)" \
    ; python3 -c "import dstore.codec._jpegcrop" 2>&1 | tail -1
