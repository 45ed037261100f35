#!/usr/bin/env bash
# Runs every test of every module in the repository (each folder with a
# go.mod), under the race detector, after go vet and staticcheck. bench/
# also runs its benchmark program in quick mode, so it cannot rot; its
# tables are shown only if it fails. Every module runs even when one fails;
# the summary names each failure and the script then exits non-zero. Quiet
# when all is well: the packages' ok lines, then a summary.
#
# staticcheck is the version pinned below, run with `go run` (fetched
# through the module proxy once, then cached), so a fresh machine needs
# nothing installed but Go.
set -uo pipefail
cd "$(dirname "$0")"
staticcheck=honnef.co/go/tools/cmd/staticcheck@v0.8.2
mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
failed=()
step() { # step NAME COMMAND...: runs COMMAND, records NAME if it fails
	local name=$1
	shift
	if ! "$@"; then
		failed+=("$name")
	fi
}
for dir in "${modules[@]}"; do
	echo "== module $dir"
	step "$dir: go vet" bash -c "cd '$dir' && go vet ./..."
	step "$dir: staticcheck" bash -c "cd '$dir' && go run $staticcheck ./..."
	step "$dir: go test" bash -c "cd '$dir' && go test -race -count=1 -timeout 10m ./... 2>&1 | grep -v '^?.*\[no test files\]$'; exit \${PIPESTATUS[0]}"
done
if [ -f bench/go.mod ]; then
	echo "== bench quick mode"
	out=$(mktemp)
	if (cd bench && go run ./cmd/ferrybench -quick) >"$out" 2>&1; then
		echo "ok  	ferrybench -quick"
	else
		cat "$out"
		failed+=("bench: ferrybench -quick")
	fi
	rm -f "$out"
fi
if [ ${#failed[@]} -gt 0 ]; then
	echo "FAILED (${#failed[@]}):" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "all ${#modules[@]} modules passed (vet, staticcheck, tests)"
