"""`corral-utility-hand`: serves the utility tools (`get_time`, `calculate`) on `corral-utility`."""

from workers.roles import utility_hand_worker
from workers.run import connect_to_temporal, run_until_stopped, run_worker
from workers.settings import TemporalSettings


async def _serve(settings: TemporalSettings) -> None:
    client = await connect_to_temporal(settings)
    await run_until_stopped([utility_hand_worker(client)])


def main() -> None:
    run_worker("corral-utility-hand", TemporalSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
