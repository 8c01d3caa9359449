#!/usr/bin/env bash
# Builds the examples against an installed emm two ways, with pkg-config (Makefile)
# and with CMake (find_package(emm)), and runs what was built.
#
#   examples/cpp/check.sh --prefix DIR --build DIR [--standin LIB] [--gpu] [--strict]
#
# --prefix   the installed tree (`cargo xtask install --prefix DIR`)
# --build    an empty directory for the builds
# --standin  libemm_standin.so: emm_hello also runs on the stand-in driver
# --gpu      emm_hello and emm_example also run on the real driver (a GPU machine)
# --strict   a missing tool (make, pkg-config, cmake, the C++ compiler) fails the run
#            instead of being reported as SKIPPED (CI is strict)
#
# emm_hello always runs once with no driver (EMM_CUDA_DRIVER naming a missing file):
# it must exit with status 3 and emm's typed error. Tools: $MAKE, $PKG_CONFIG,
# $CMAKE, $CXX, $CC (defaults make, pkg-config, cmake, c++, cc). emm_fork (C) runs
# wherever emm_hello does, but not with no driver. Run by `cargo xtask ci`
# (strict, stand-in) and by gpu-bundle/cpp.sh (`cargo xtask gpu`). The last line
# is a summary; the exit status is 0 when nothing failed and something was built.
set -u
SRC=$(cd "$(dirname "$0")" && pwd)
PREFIX="" BUILD="" STANDIN="" GPU=0 STRICT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --standin) STANDIN=$2; shift 2 ;;
    --gpu) GPU=1; shift ;;
    --strict) STRICT=1; shift ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$PREFIX" ] || [ -z "$BUILD" ]; then
  echo "usage: check.sh --prefix DIR --build DIR [--standin LIB] [--gpu] [--strict]" >&2
  exit 2
fi
MAKE=${MAKE:-make} PKG_CONFIG=${PKG_CONFIG:-pkg-config} CMAKE=${CMAKE:-cmake} CXX=${CXX:-c++} CC=${CC:-cc}
export CXX CC
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
# The library must come from the prefix (its rpath), not from the environment.
unset LD_LIBRARY_PATH EMM_MEMORY_MANAGER EMM_LOG

pass=0 fail=0 skipped="" built=""
ok() { pass=$((pass + 1)); echo "ok      $*"; }
bad() { fail=$((fail + 1)); echo "FAIL    $*"; }
skip() {
  if [ $STRICT = 1 ]; then bad "$* (--strict: every tool must be there)"; else
    skipped="$skipped; $*"; echo "SKIPPED $*"; fi
}
have() { command -v "$1" > /dev/null 2>&1; }
indent() { sed 's/^/        /'; }

# 1. pkg-config, through the Makefile.
if ! have "$CXX" || ! have "$CC"; then
  skip "the pkg-config build: no C/C++ compiler ($CXX, $CC)"
elif ! have "$PKG_CONFIG"; then
  skip "the pkg-config build: $PKG_CONFIG is not installed"
elif ! have "$MAKE"; then
  skip "the pkg-config build: $MAKE is not installed"
else
  goals=all
  [ $GPU = 1 ] && have "${NVCC:-nvcc}" && goals="all cuda"
  echo "==      pkg-config: $PKG_CONFIG --cflags --libs emm = $(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" "$PKG_CONFIG" --cflags --libs emm 2>&1)"
  if "$MAKE" -C "$SRC" BUILD="$BUILD/make" PKG_CONFIG="$PKG_CONFIG" PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" CXX="$CXX" CC="$CC" $goals > "$BUILD/make.log" 2>&1; then
    ok "pkg-config build (make $goals)"
    built="$built $BUILD/make/emm_hello $BUILD/make/emm_fork"
    [ -x "$BUILD/make/emm_example" ] && built="$built $BUILD/make/emm_example"
  else
    bad "pkg-config build (make $goals):"; indent < "$BUILD/make.log"
  fi
fi

# 2. CMake: find_package(emm CONFIG REQUIRED) and emm::emm.
if ! have "$CMAKE"; then
  skip "the CMake build: $CMAKE is not installed"
elif ! have "$CXX" || ! have "$CC"; then
  skip "the CMake build: no C/C++ compiler ($CXX, $CC)"
else
  echo "==      $("$CMAKE" --version | head -n1)"
  if "$CMAKE" -S "$SRC" -B "$BUILD/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release > "$BUILD/cmake.log" 2>&1 \
    && "$CMAKE" --build "$BUILD/cmake" >> "$BUILD/cmake.log" 2>&1; then
    ok "CMake build"
    grep -E -- '-- (emm |CUDA compiler|No CUDA compiler)' "$BUILD/cmake.log" | indent
    built="$built $BUILD/cmake/emm_hello $BUILD/cmake/emm_fork"
    [ -x "$BUILD/cmake/emm_example" ] && built="$built $BUILD/cmake/emm_example"
  else
    bad "CMake build:"; indent < "$BUILD/cmake.log"
  fi
fi

# 3. Run what was built.
expect() { # expect NAME STATUS TEXT -- command...: the status, and TEXT in the output
  local name=$1 want=$2 text=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq "$want" ] && grep -q -- "$text" <<< "$out"; then ok "$name"; else
    bad "$name: exit status $rc (expected $want), output (expected to hold \"$text\"):"; fi
  indent <<< "$out"
}
for bin in $built; do
  name=${bin#"$BUILD"/}
  case "$bin" in
    */emm_hello)
      expect "$name, no driver: exit status 3 and emm's error" 3 "no CUDA driver could be loaded" -- \
        env EMM_CUDA_DRIVER="$BUILD/no-such-libcuda.so.1" "$bin"
      if [ -n "$STANDIN" ]; then
        expect "$name on the stand-in driver" 0 "emm_hello: done" -- env EMM_CUDA_DRIVER="$STANDIN" "$bin"
      fi
      if [ $GPU = 1 ]; then
        for m in pool default hostonly; do
          expect "$name $m on the GPU" 0 "emm_hello: done" -- env -u EMM_CUDA_DRIVER "$bin" "$m"
        done
      fi
      ;;
    */emm_fork)
      if [ -n "$STANDIN" ]; then
        for m in pool default hostonly; do
          expect "$name $m on the stand-in driver: a forked child gets EMM_ERR_FORKED" 0 "emm_fork: done" -- env EMM_CUDA_DRIVER="$STANDIN" "$bin" "$m"
        done
      fi
      if [ $GPU = 1 ]; then
        for m in pool default hostonly; do
          expect "$name $m on the GPU: a forked child gets EMM_ERR_FORKED" 0 "emm_fork: done" -- env -u EMM_CUDA_DRIVER "$bin" "$m"
        done
      fi
      ;;
    */emm_example)
      [ $GPU = 1 ] && expect "$name on the GPU" 0 "emm_example: OK" -- env -u EMM_CUDA_DRIVER "$bin" pool
      ;;
  esac
done
[ -z "$built" ] && bad "nothing was built"
echo "cpp examples: $pass passed, $fail failed${skipped:+; SKIPPED${skipped#;}}"
[ $fail -eq 0 ]
