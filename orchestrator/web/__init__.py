"""The dashboard (`orch dashboard`): a live web view of the ledger's jobs, GPUs, loss and money,
served by orch itself. The only home of starlette, uvicorn and jinja2; it reads the ledger
through `ledger.view` and draws with `report/`, so its pages agree with `orch status`,
`orch cost` and `orch report`."""
