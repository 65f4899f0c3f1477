"""The parts of the ``dibs`` command (:mod:`dibs.cli`); only the command imports them, ``import dibs`` never.

============  =====================================================================================
module        job
============  =====================================================================================
``parser``    the options, the help texts and the checks argparse cannot make
``exits``     the exit statuses, and which one an error ends the command with
``stops``     SIGINT/SIGTERM/SIGHUP: stop a waiter quietly, or hand the signal to the command
``command``   run COMMAND in its own process group, stream and keep its stdout, stop it on a signal
``guard``     a watchdog process that kills COMMAND's process group if ``dibs`` itself is killed
``console``   stderr: a live status line on a terminal, one line (or JSON) per event elsewhere
``watch``     what a waiter sees while it waits: holder, lease expiry, takeovers, failures
``run``       ``dibs run`` and ``dibs wait``: the waits, the work under the lease, the JSON envelope
``admin``     ``ls``, ``top``, ``show``, ``release``, ``forget``, ``reap``, ``prune``: inspect and repair
``top``       ``dibs top``: the live state of a namespace, redrawn in place
``names``     keys as people type them: a readable name or a glob stands for the keys it names
``spool``     with a payload store: COMMAND's stdout streamed into it, and payloads streamed out
``text``      durations, sizes, artifacts as text or base64, tables wrapped at word boundaries
============  =====================================================================================
"""
