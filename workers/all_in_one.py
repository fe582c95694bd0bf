"""`corral-all-in-one`: every role in one process, for local use. The roles still use separate task queues."""

from corral.temporal import ensure_search_attributes
from workers.model import model_role
from workers.roles import harness_worker, utility_hand_worker
from workers.run import connect_to_temporal, run_until_stopped, run_worker
from workers.sandbox import sandbox_role
from workers.settings import AllInOneSettings


async def _serve(settings: AllInOneSettings) -> None:
    client = await connect_to_temporal(settings.temporal)
    await ensure_search_attributes(client)
    async with sandbox_role(client, settings.sandbox) as sandbox:
        await run_until_stopped(
            [harness_worker(client), *model_role(client, settings.model), utility_hand_worker(client), *sandbox]
        )


def main() -> None:
    run_worker("corral-all-in-one", AllInOneSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
