"""`corral-harness`: runs `SessionWorkflow` on `corral-harness`. Stateless: kill it any time."""

from corral.temporal import ensure_search_attributes
from workers._run import connect_to_temporal, run_until_stopped, run_worker
from workers._settings import TemporalSettings
from workers.roles import harness_worker


async def _serve(settings: TemporalSettings) -> None:
    client = await connect_to_temporal(settings)
    await ensure_search_attributes(client)
    await run_until_stopped([harness_worker(client)])


def main() -> None:
    run_worker("corral-harness", TemporalSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
