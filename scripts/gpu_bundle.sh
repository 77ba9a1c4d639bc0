#!/usr/bin/env bash
# Builds the CUDA-enabled strata and strata_tests on this (development) machine and bundles them,
# stripped, with the shared libraries a bare GPU machine lacks (everything ldd resolves except the
# C/C++ runtime and the driver), the reference fixtures, and the scripts that run there
# (gpu_run.sh, gpu_models.sh, gpu_kernels.sh), as one xz archive of a folder `bundle`
# (docs/CUDA.md, "GPU machine workflow").
#
#   scripts/gpu_bundle.sh ARCHIVE [BUILD_DIR] [--base STRATA_BINARY]
#
# BUILD_DIR (default build-cuda) is configured for sm_90 without the benchmarks binary. --base adds
# another build's strata as bin/strata-base, for A/B runs in one call (STRATA_BIN=strata-base
# gpu_models.sh ...); xz's 64 MiB window stores the second binary's shared bytes once. The archive
# travels with the working tree (the device tool carries 64 MiB in all), so the script fails past
# 32 MiB.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: gpu_bundle.sh ARCHIVE [BUILD_DIR] [--base STRATA_BINARY]"
archive=${1:?$usage}
shift
build=$root/build-cuda
base=
while (($#)); do
  case $1 in
    --base) base=${2:?$usage}; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
[[ -z $base || -x $base ]] || { echo "gpu_bundle: --base $base is not an executable" >&2; exit 1; }
limit_mib=32
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
bundle=$staging/bundle

if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSTRATA_BENCH=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
grep -q 'STRATA_HAVE_CUDA' "$build/build.ninja" ||
  { echo "gpu_bundle: $build has no CUDA backend (is nvcc installed?)" >&2; exit 1; }
# The shared build gate where there is one (the development box), else a plain build.
targets=(strata strata_tests strata_handshake_bench)
grep -q 'strata_kernel_timeline' "$build/build.ninja" && targets+=(strata_kernel_timeline)
if [[ -x /work/bin/strata-build ]]; then
  /work/bin/strata-build "$build" --target "${targets[@]}"
else
  cmake --build "$build" --target "${targets[@]}"
fi

mkdir -p "$bundle/bin" "$bundle/lib"
for exe in strata strata_tests strata_handshake_bench; do
  cp "$build/$exe" "$bundle/bin/$exe"
  strip --strip-unneeded "$bundle/bin/$exe"
done
# The kernel timeline (gpu_timeline.sh) with the CUPTI it loads, where the toolkit has CUPTI.
if [[ -f $build/libstrata_kernel_timeline.so ]]; then
  cp "$build/libstrata_kernel_timeline.so" "$bundle/lib/"
  ldd "$build/libstrata_kernel_timeline.so" | awk '/libcupti.*=> \//{print $1, $3}' |
    while read -r name path; do cp -L "$path" "$bundle/lib/$name"; done
fi
if [[ -n $base ]]; then
  cp "$base" "$bundle/bin/strata-base"
  strip --strip-unneeded "$bundle/bin/strata-base"
fi

# Shared libraries: all that ldd resolves except what every Linux with the NVIDIA driver has.
base='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libnvidia)[.-]'
ldd "$build/strata" "$build/strata_tests" | awk '/=> \//{print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ $name =~ $base ]]; then continue; fi
    cp -L "$path" "$bundle/lib/$name"
    strip --strip-unneeded "$bundle/lib/$name" 2>/dev/null || true
  done
cp -r "$root/tests/fixtures" "$bundle/fixtures"  # the reference fixtures (test_fixtures_model.cpp)
for script in gpu_run.sh gpu_models.sh gpu_kernels.sh gpu_timeline.sh; do
  cp "$root/scripts/$script" "$bundle/"
  chmod +x "$bundle/$script"
done

(cd "$staging" && XZ_OPT=-9 tar cJf bundle.txz bundle)
mv "$staging/bundle.txz" "$archive"
size_kib=$(du -sk "$archive" | cut -f1)
echo "gpu_bundle: $archive, $((size_kib / 1024)) MiB compressed, of:"
ls -l "$bundle/bin" "$bundle/lib" | awk 'NF > 5 {print "  " $5, $NF}'
if ((size_kib > limit_mib * 1024)); then
  echo "gpu_bundle: the archive exceeds $limit_mib MiB" >&2
  exit 1
fi
