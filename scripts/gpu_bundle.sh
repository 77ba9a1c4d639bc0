#!/usr/bin/env bash
# Builds the CUDA-enabled strata and strata_tests on this (development) machine and bundles them,
# stripped, with the shared libraries a bare GPU machine lacks (everything ldd resolves except the
# C/C++ runtime and the driver), the reference fixtures, and scripts/gpu_run.sh, which runs there
# (docs/CUDA.md, "GPU machine workflow").
#
#   scripts/gpu_bundle.sh BUNDLE_DIR [BUILD_DIR]
#
# BUILD_DIR (default build-cuda) is configured for sm_90 without the benchmarks binary. The bundle
# must stay well under the device tool's 64 MiB carry limit; the script prints its size and fails
# past 48 MiB.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:?usage: gpu_bundle.sh BUNDLE_DIR [BUILD_DIR]}
build=${2:-$root/build-cuda}
limit_mib=48

if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSTRATA_BENCH=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
grep -q 'STRATA_HAVE_CUDA' "$build/build.ninja" ||
  { echo "gpu_bundle: $build has no CUDA backend (is nvcc installed?)" >&2; exit 1; }
# The shared build gate where there is one (the development box), else a plain build.
if [[ -x /work/bin/strata-build ]]; then
  /work/bin/strata-build "$build" --target strata strata_tests strata_handshake_bench
else
  cmake --build "$build" --target strata strata_tests strata_handshake_bench
fi

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for exe in strata strata_tests strata_handshake_bench; do
  cp "$build/$exe" "$bundle/bin/$exe"
  strip --strip-unneeded "$bundle/bin/$exe"
done

# Shared libraries: all that ldd resolves except what every Linux with the NVIDIA driver has.
base='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda|libnvidia)[.-]'
ldd "$build/strata" "$build/strata_tests" | awk '/=> \//{print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ $name =~ $base ]]; then continue; fi
    cp -L "$path" "$bundle/lib/$name"
    strip --strip-unneeded "$bundle/lib/$name" 2>/dev/null || true
  done
cp -r "$root/tests/fixtures" "$bundle/fixtures"  # the reference fixtures (test_fixtures_model.cpp)
cp "$root/scripts/gpu_run.sh" "$root/scripts/gpu_models.sh" "$root/scripts/gpu_kernels.sh" "$bundle/"
chmod +x "$bundle/gpu_run.sh" "$bundle/gpu_models.sh" "$bundle/gpu_kernels.sh"

size_kib=$(du -sk "$bundle" | cut -f1)
echo "gpu_bundle: $bundle, $((size_kib / 1024)) MiB:"
ls -l "$bundle/bin" "$bundle/lib" | awk 'NF > 5 {print "  " $5, $NF}'
if ((size_kib > limit_mib * 1024)); then
  echo "gpu_bundle: the bundle exceeds $limit_mib MiB" >&2
  exit 1
fi
