"""`gpus`, `check`, `ls`, `ssh-config`: what exists, what is set up, what runs and bills, and the ssh aliases.

None of these needs a stack to be selected, and none waits on a host for long: they are what a
user reaches for first, so each works (and says what is missing) with no Pulumi CLI, no
credentials and no VM.
"""

from __future__ import annotations

import json

from invoke import Context, task

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from gpu_train.stack.problems import ConfigError
from remote.tasks.optional import optional_positional
from remote.tasks.session import STACK_HELP, Session


@task(
    positional=["name"],
    help={
        "name": "one GPU: a short name (T4, L4, A100, A100-80GB, H100, H200, B200) or an API name",
        "region": "only what is offered in this region (e.g. us-central1)",
        "spot": "spot prices, and only shapes that can be had as spot",
        "json": "print JSON",
    },
)
def gpus(c: Context, name: str | None = None, region: str | None = None, spot: bool = False, json_: bool = False) -> None:
    """GPU types from the catalog: shapes, regions and zones, on-demand and spot $/h, spot- or reservation-only."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.views import offers

    catalog = load_catalog()
    try:
        rows = offers.offers(catalog, name, region, spot)
    except offers.OfferError as e:
        raise UsageError(str(e)) from None
    if json_:
        print(json.dumps(offers.to_json(rows, catalog), indent=1))
    elif not rows:
        where = f" in {region}" if region else ""
        raise GpuTrainError(f"{name or 'no GPU'} is not offered{where}{' as spot' if spot else ''} (catalog snapshot)")
    elif name:
        print(offers.render_detail(rows[0], catalog, spot))
    else:
        print(offers.render_table(rows, catalog, spot))


optional_positional(gpus, "name")  # `gpus` lists every GPU, `gpus T4` one


@task(help={"json": "print JSON: findings[].{what, ok, detail, fix}"})
def check(c: Context, json_: bool = False) -> None:
    """Is everything the GCP path needs in place? Pulumi CLI and login, credentials, APIs, SSH keys, stack files.

    Each item passes or fails with its fix; exit 1 when something is missing.
    """
    from gpu_train.views import checkup
    from remote.tasks import gather as overview

    findings = overview.check_findings(Environment.of(c))
    if json_:
        print(json.dumps({"findings": [f.to_json() for f in findings], "ok": checkup.exit_code(findings) == 0}, indent=1))
    else:
        print(checkup.render(findings))
    if checkup.exit_code(findings):
        raise GpuTrainError()


@task(
    name="ls",
    help={
        "json": "print JSON: stacks[].{stack, state, runsRunning, hourlyNow, spentMonth, ...}",
        "offline": "do not ask the hosts (no SSH): runs and idle clocks stay unknown",
    },
)
def ls_(c: Context, json_: bool = False, offline: bool = False) -> None:
    """Every stack at a glance, billing ones first: shape, zone, VM state, runs, $/h now, this month, idle stop.

    VM states come from the Compute API when you have credentials, else from the last known
    outputs; hosts believed up are asked for their runs for a few seconds at most.
    """
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.views import listing
    from remote.tasks import gather as overview

    env = Environment.of(c)
    table = listing.rows(overview.ls_facts(env, ask_hosts=not offline), env.clock(), load_catalog())
    if json_:
        print(json.dumps({"stacks": [r.to_json() for r in table]}, indent=1))
    else:
        print(listing.render(table))


@task(
    positional=["name"],
    help={"name": "the stack to use from now on in this project (a name from the list)", "clear": "forget the selected stack"},
)
def stack(c: Context, name: str | None = None, clear: bool = False) -> None:
    """Select the project's stack, as `pulumi stack select` does; alone, say which one tasks use and list them.

    Kept in the project's .gpu-train/stack; --stack and $GPU_TRAIN_STACK still win for one command.
    """
    from gpu_train.stack import project
    from remote.ssh import target

    env = Environment.of(c)
    root, dirs = env.project_root, env.stack_dirs
    if clear:
        project.select_stack(root, None)
        print("no stack selected in this project now")
    elif name is not None:
        if not target.STACK_NAME_RE.fullmatch(name) or project.stack_path(name, dirs) is None:
            close = project.did_you_mean(name, project.stack_names(dirs))
            raise UsageError(
                f"no stack named {name!r} (looked for Pulumi.{name}.yaml in {', '.join(str(d) for d in dirs)})"
                + (f"; did you mean {' or '.join(close)}?" if close else "")
            )
        project.select_stack(root, name)
    try:
        current, why = target.chosen_stack(env, None)
    except ConfigError as e:
        current, why = None, e.problems[0].message
    print(f"current stack: {current} ({why})" if current else f"current stack: none ({why})")
    for path in project.listed_stack_files(root, env.stacks_dir):
        mark = "*" if path.name.removeprefix("Pulumi.").rsplit(".", 1)[0] == current else " "
        print(f"{mark} {path.name.removeprefix('Pulumi.').rsplit('.', 1)[0]:<20} {path}")


optional_positional(stack, "name")


@task(name="ssh-config", help={"remove": "take the Include line and every gpu-train alias away", "stack": STACK_HELP})
def ssh_config(c: Context, remove: bool = False, stack: str | None = None) -> None:
    """Make `ssh gpu-train-STACK` work: write the stack's alias and add one Include line to ~/.ssh/config.

    The first task that reaches a stack writes its alias anyway; this adds the Include line
    without asking. --remove undoes both.
    """
    from remote.ssh import alias as sshalias

    env = Environment.of(c)
    home = sshalias.own_home(env)
    if remove:
        done = sshalias.remove(home)
        print("\n".join(done) if done else "nothing to remove")
        return
    session = Session(env, stack)
    alias, _ = sshalias.write_alias(session.target, home, env.project_root)
    try:
        conf = sshalias.add_include(home)
    except OSError as e:
        raise GpuTrainError(str(e)) from None
    print(f"ssh {alias} works now ({sshalias.include_line(home)} in {conf})")
