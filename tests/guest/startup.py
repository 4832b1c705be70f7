"""The startup script of the tier's guests: the one the Pulumi program declares, and the stand-in for
Google's runner that fetches it from the metadata server and runs it at every boot.

Its own module because it is what the guest runs rather than the guest itself (tests/guest/harness.py
installs the runner and its unit in every guest; the tests hand the program's script to the metadata server).
"""

from __future__ import annotations


def startup_script_of(raw_config: dict, stack: str = "guest") -> str:
    """The ``startup-script`` metadata of the VM the Pulumi program declares for these settings
    (the real program, under Pulumi's mock runtime)."""
    from infra import program
    from infra.ops import preview

    result = preview.run(program.main, stack=stack, config=raw_config)
    if result.error is not None:
        raise AssertionError(f"the program failed under mocks: {result.error}")
    instances = result.of_type("compute/instance:Instance")
    return instances[0].inputs["metadata"]["startup-script"]


STARTUP_RUNNER = r'''#!/usr/bin/python3
"""Stand-in for google_metadata_script_runner: fetch instance/attributes/startup-script, run it."""
import os, subprocess, sys, tempfile, time, urllib.request
base = os.environ.get("GPU_TRAIN_METADATA_URL") or "http://169.254.169.254/computeMetadata/v1/"
req = urllib.request.Request(base + "instance/attributes/startup-script", headers={"Metadata-Flavor": "Google"})
for attempt in range(30):  # as Google's runner does, it asks the metadata server again when it does not answer
    try:
        script = urllib.request.urlopen(req, timeout=10).read()
        break
    except OSError as e:  # urllib's HTTPError too
        if getattr(e, "code", None) == 404:
            print("startup-script: none in the metadata", flush=True)
            sys.exit(0)
        print("startup-script: metadata server:", e, flush=True)
        time.sleep(2)
else:
    sys.exit("startup-script: the metadata server did not answer")
with tempfile.NamedTemporaryFile(prefix="startup-script-", delete=False) as f:
    f.write(script)
print("startup-script: running", f.name, flush=True)
code = subprocess.run(["/bin/bash", f.name]).returncode
print(f"startup-script exit status {code}", flush=True)
sys.exit(code)
'''

# As google-guest-agent's google-startup-scripts.service: after the network, KillMode=process so
# what the script starts is not killed when it returns.
STARTUP_UNIT = """[Unit]
Description=Google Compute Engine Startup Scripts (gpu-train test stand-in)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/bin/google_metadata_script_runner startup
KillMode=process
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""
