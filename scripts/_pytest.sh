# Shared by scripts/test and scripts/matrix (sourced, after _env.sh): pytest in two parts.
#
#   pytest_in_two_parts COMMAND... -- PYTEST-ARGS...
#     1. the tests that may run beside others, on one more worker than cores (pytest-xdist):
#          COMMAND -n WORKERS --dist loadfile -m "not serial" PYTEST-ARGS
#        (--dist loadfile: a file's tests run on one worker, in order: the docs' blocks build on each
#        other, and a module's fixtures are set up once);
#     2. the serial ones (tests/serial.py marks them: the real multi-process scenarios, by file),
#        one at a time in each of three lanes, three pytest runs started together:
#          COMMAND -m "serial and not lane2 and not lane3" PYTEST-ARGS
#          COMMAND -m "serial and lane2" PYTEST-ARGS   (the reliability suite, which mostly waits)
#          COMMAND -m "serial and lane3" PYTEST-ARGS   (the demo, the store restarts, Airflow's
#                                                       dag.test() and Prefect's flow-run processes)
#        (the other lanes' output is shown when all have ended; tests/serial.py says why these);
#        on one core (or DIBS_TEST_WORKERS=1), one run: COMMAND -m serial PYTEST-ARGS.
#   The status is the first failing part's. A part that selects no test (pytest's status 5) passes
#   when the other one ran tests, so 5 comes only from a selection that matches nothing at all.
#   With -x, --exitfirst or --maxfail, a failing first part skips the second.
#   WORKERS: DIBS_TEST_WORKERS, else one more than the number of cores, at most 5 (each worker starts
#   its own Prefect test server and Azurite when its files need them). One more: these tests wait on
#   services, sleeps and leases running out, so as many workers as cores left half of the CPU idle
#   (2 cores: 2 workers used 100 % of 200 % and took 4:28; 3 workers 3:32, 4 workers 3:22 for 10 %
#   more CPU than 3). The lanes of part 2 need 2 cores: on one, part 2 is one run.
#
#   pytest_single_call PYTEST-ARGS...
#     Succeeds when the arguments ask for something two parts would get wrong: paths or test ids
#     (`scripts/test tests/test_cli.py`, `... tests/unit`, `... README.md docs`), or an option that
#     chooses markers, workers or plugins, or debugs or only lists (-m, -n, -p, --pdb, --co, ...).
#     Those go to one plain pytest call.

_pytest_takes_value() {  # pytest options whose value is the next argument
  case "$1" in
    -k | -m | -p | -c | -o | -W | -r | -n | --tb | --deselect | --ignore | --ignore-glob | --durations | \
      --durations-min | --maxfail | --timeout | --timeout-method | --basetemp | --junitxml | --junit-xml | \
      --rootdir | --confcutdir | --log-level | --log-file | --log-cli-level | --capture | --import-mode | \
      --color | --numprocesses | --maxprocesses | --dist | --override-ini | --pythonwarnings | \
      --hypothesis-seed | --hypothesis-profile | --hypothesis-verbosity) return 0 ;;
  esac
  return 1
}

pytest_single_call() {
  local skip_next=0 arg
  for arg in "$@"; do
    if [[ $skip_next -eq 1 ]]; then skip_next=0; continue; fi
    case "$arg" in
      -m | -m?* | -n | -n?* | --numprocesses* | --dist* | -p | -p?* | --pdb* | --trace | --co | \
        --collect-only | --collectonly | --setup-plan | --setup-only | --fixtures* | --markers | \
        -h | --help | --version | -V) return 0 ;;
      -*) _pytest_takes_value "$arg" && skip_next=1 ;;
      *) [[ "$arg" == *::* || -e "$arg" ]] && return 0 ;;
    esac
  done
  return 1
}

_pytest_statuses() {  # two runs' statuses as one: the first failure; 5 (no test) only when both are 5
  local status
  for status in "$@"; do
    if [[ $status -ne 0 && $status -ne 5 ]]; then echo "$status"; return; fi
  done
  if [[ $1 -eq 5 && $2 -eq 5 ]]; then echo 5; else echo 0; fi
}

pytest_in_two_parts() {
  local command=() args arg workers exitfirst=0 first=0 second=0 started
  while [[ $# -gt 0 && "$1" != "--" ]]; do command+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && shift
  args=("$@")
  for arg in "${args[@]}"; do
    case "$arg" in -x | --exitfirst | --maxfail*) exitfirst=1 ;; esac
  done
  local cores
  cores="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
  workers="${DIBS_TEST_WORKERS:-$((cores + 1))}"
  [[ -z "${DIBS_TEST_WORKERS:-}" && "$workers" -gt 5 ]] && workers=5

  echo "== pytest, part 1 of 2: the tests that may run beside others, on $workers workers" >&2
  started=$SECONDS
  "${command[@]}" -n "$workers" --dist loadfile -m "not serial" "${args[@]}" || first=$?
  local first_time=$((SECONDS - started))
  if [[ $exitfirst -eq 1 && $first -ne 0 && $first -ne 5 ]]; then
    echo "== pytest: part 1 failed (status $first) and -x/--maxfail was given: part 2 not run" >&2
    return "$first"
  fi
  started=$SECONDS
  if [[ "$cores" -ge 2 && "${DIBS_TEST_WORKERS:-2}" -ge 2 ]]; then
    echo "== pytest, part 2 of 2: the serial tests (tests/serial.py), one at a time in each of three" \
      "lanes; the output of lanes 2 and 3 (the tests marked lane2, lane3) follows when all have ended" >&2
    local lane lane_status logs=() pids=()
    for lane in lane2 lane3; do
      logs+=("$(mktemp "${TMPDIR:-/tmp}/dibs-serial-$lane.XXXXXX")")
      "${command[@]}" -m "serial and $lane" "${args[@]}" >"${logs[-1]}" 2>&1 &
      pids+=("$!")
    done
    "${command[@]}" -m "serial and not lane2 and not lane3" "${args[@]}" || second=$?
    for lane in 0 1; do
      lane_status=0
      wait "${pids[$lane]}" || lane_status=$?
      echo "== pytest, part 2, lane $((lane + 2)) (tests marked lane$((lane + 2))): status $lane_status" >&2
      cat "${logs[$lane]}"
      rm -f "${logs[$lane]}"
      second=$(_pytest_statuses "$second" "$lane_status")
    done
  else
    echo "== pytest, part 2 of 2: the serial tests (tests/serial.py), one at a time" >&2
    "${command[@]}" -m serial "${args[@]}" || second=$?
  fi
  echo "== pytest: part 1 (parallel) $((first_time / 60))m$((first_time % 60))s, status $first;" \
    "part 2 (serial) $(((SECONDS - started) / 60))m$(((SECONDS - started) % 60))s, status $second" >&2
  if [[ $first -ne 0 && $first -ne 5 ]]; then return "$first"; fi
  if [[ $second -ne 0 && $second -ne 5 ]]; then return "$second"; fi
  if [[ $first -eq 5 && $second -eq 5 ]]; then return 5; fi
  return 0
}
