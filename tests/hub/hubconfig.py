"""The tests' jupyterhub_config.py: the plain-Hub config of docs/jupyterhub.md, plus test-only parts.

What docs/jupyterhub.md tells an admin to write is between the ``# --- as in
docs/jupyterhub.md`` markers, with only paths, ports and the test's settings
file filled in; the rest (ports, the dummy authenticator, the driver service,
users and groups) is what a test needs to run a Hub on loopback.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = '''
import json, os
c = get_config()  # noqa

# --- test-only: where and who
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = "sqlite:///jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "jupyterhub_cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = "hub-test-password"
c.JupyterHub.spawner_class = "simple"
c.Spawner.default_url = "/lab"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root"] if os.geteuid() == 0 else []
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.SimpleLocalProcessSpawner.home_dir_template = {homes!r} + "/{{username}}"
c.Authenticator.allowed_users = set({users!r})
c.Authenticator.admin_users = {{"hubadmin"}}
c.JupyterHub.load_groups = {{name: {{"users": members}} for name, members in {groups!r}.items()}}
driver = {{"name": "driver", "api_token": {driver_token!r}}}

# --- as in docs/jupyterhub.md
gpupool_url = "http://127.0.0.1:{gpupool_port}"
c.JupyterHub.services.append({{
    "name": "gpupool",
    "url": gpupool_url,
    "command": [{python!r}, "-m", "gpupool", "serve", "--hub", "--port", "{gpupool_port}",
                "--state-dir", {state_dir!r}, "--simulate", "A100-80GB", "--config", {settings_file!r}],
    "environment": {{"GPUPOOL_ADMIN_TOKEN": {gpupool_admin_token!r}, "PYTHONPATH": os.environ["PYTHONPATH"],
                     **({{"GPUPOOL_RUN_JOBS_AS": {run_jobs_as!r}}} if {run_jobs_as!r} else {{}})}},
}})
c.JupyterHub.load_roles.extend([
    # every user may use the pool, and so may the token their server gets (JUPYTERHUB_API_TOKEN)
    {{"name": "user", "scopes": ["self", "access:services!service=gpupool"]}},
    # gpupool lists the Hub's groups, so their projects exist before any member logs in
    {{"name": "gpupool", "services": ["gpupool"], "scopes": ["list:groups", "read:groups:name"]}},
])
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                "access:services!service=gpupool"]
c.Spawner.environment.update({{"GPUPOOL_URL": gpupool_url}})
# --- end

# --- test-only: the driver (the test's admin), and gpupool as an external service when asked
c.JupyterHub.services.append(driver)
c.JupyterHub.load_roles.append(
    {{"name": "gpupool-driver", "services": ["driver"],
      "scopes": ["admin:users", "admin:groups", "tokens", "admin:servers", "access:servers", "access:services"]}})
if {external_token!r}:
    c.JupyterHub.services = [{{"name": "gpupool", "url": gpupool_url, "api_token": {external_token!r}}}, driver]

# --- test-only: the service publishes its runtime file in the test's folder (the Hub passes a service
# none of its own environment: it would write into the real ~/.local/share/gpupool/runtime)
services = c.JupyterHub.services  # appended to: traitlets' lazy value until the Hub reads it; set: a list
for service in services if isinstance(services, list) else services.get_value([]):
    if "environment" in service:
        service["environment"]["GPUPOOL_RUNTIME_DIR"] = {runtime_dir!r}
'''


USERS = ["alice", "bob", "carol", "dave", "hubadmin", "admin"]  # admin: the gpupool admin token's name
GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob"], "robotics": []}


def hub_config_text(*, port: int, hub_port: int, proxy_api_port: int, gpupool_port: int, chp: str, python: str,
                    state_dir: str, settings_file: str, driver_token: str, gpupool_admin_token: str,
                    run_jobs_as: str, runtime_dir: str, users: list[str] | None = None,
                    groups: dict[str, list[str]] | None = None, external_token: str = "") -> str:
    """The config file's text with the test's ports, paths, tokens, users and groups filled in
    (hubadmin is always the Hub's admin); ``runtime_dir``: the managed service's runtime folder."""
    singleuser = str(Path(python).with_name("jupyterhub-singleuser"))
    homes = str(Path(state_dir).parent / "homes")
    users = sorted(set(users if users is not None else USERS) | {"hubadmin"})
    return TEMPLATE.format(external_token=external_token, homes=homes, users=users, groups=GROUPS if groups is None else groups, port=port, hub_port=hub_port, proxy_api_port=proxy_api_port, gpupool_port=gpupool_port,
                           chp=chp, python=python, state_dir=state_dir, settings_file=settings_file,
                           driver_token=driver_token, gpupool_admin_token=gpupool_admin_token,
                           run_jobs_as=run_jobs_as, singleuser=singleuser, runtime_dir=runtime_dir)
