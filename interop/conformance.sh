#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in
# interop/package.json, run on the Node 22 that comes with it) against a server URL.
#
#   bash interop/conformance.sh URL [SCENARIO ...]     default: every tasks-* scenario
#
# Needs `npm ci` in interop/ first. Prints one line per scenario and a total; exits 0 only
# when every check of every scenario passed (a skipped scenario is reported, not failed).
set -euo pipefail
url=${1:?usage: conformance.sh URL [SCENARIO ...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
node=$here/node_modules/.bin/node
suite=$here/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [[ ! -x $node || ! -f $suite ]]; then
    echo "conformance.sh: run 'npm ci' in interop/ first" >&2
    exit 2
fi
scenarios=("$@")
if ((${#scenarios[@]} == 0)); then
    mapfile -t scenarios < <("$node" "$suite" list --server | sed -n 's/^  - \(tasks-[a-z0-9-]*\) .*/\1/p')
fi
if ((${#scenarios[@]} == 0)); then
    echo "conformance.sh: the suite lists no tasks-* scenario" >&2
    exit 1
fi
passed=0 failed=0 broken=0
for scenario in "${scenarios[@]}"; do
    out=$("$node" "$suite" server --url "$url" --scenario "$scenario" 2>&1) || true
    clean=$(sed 's/\x1b\[[0-9;]*m//g' <<<"$out")
    line=$(grep -E '^Passed: [0-9]+/[0-9]+' <<<"$clean" | tail -1 || true)
    if [[ -z $line ]]; then
        broken=$((broken + 1))
        echo "FAIL $scenario (no result line)"
        tail -5 <<<"$clean" | sed 's/^/    /'
        continue
    fi
    read -r ok total bad < <(sed -E 's#^Passed: ([0-9]+)/([0-9]+), ([0-9]+) failed.*#\1 \2 \3#' <<<"$line")
    if ((total == 0)); then
        echo "SKIP $scenario ($(grep -oE 'SKIPPED.*' <<<"$clean" | head -1))"
    elif ((bad > 0 || ok < total)); then
        broken=$((broken + 1))
        passed=$((passed + ok))
        failed=$((failed + total - ok))
        echo "FAIL $scenario ($ok/$total checks)"
        grep -E 'FAILURE|WARNING' <<<"$clean" | head -10 | sed 's/^/    /' || true
    else
        passed=$((passed + ok))
        echo "PASS $scenario ($ok/$total checks)"
    fi
done
echo "conformance: $passed passed, $failed failed"
((failed == 0 && broken == 0 && passed > 0))
