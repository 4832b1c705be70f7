"""Entry point for `pulumi up` (Pulumi.yaml: main: infra/): the program, handed Google's own lookups."""

try:
    from gpu_train.environment import Environment
    from infra.ops.lookups import Google
    from infra.program import main
except ModuleNotFoundError as e:  # pragma: no cover - only without scripts/setup
    raise SystemExit(f"{e}: gpu-train is not installed in .venv; run scripts/setup first") from None

main(Google(Environment.from_os()))  # this process's settings: Pulumi runs it as a program of its own
