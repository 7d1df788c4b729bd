"""Time and money to train: renting (price per GPU-hour) and owning (purchase price over its life + power).

Default prices are a dated snapshot with their sources; `--price GPU=USD_PER_HOUR` and `--buy GPU=USD`
override them. A GPU without a price gets time only.

Rent, USD per GPU-hour, on-demand, "Serverless GPU Pricing Matrix [2026 Developer Cheat Sheet]"
(techbytes.app, "Prices verified on May 7, 2026 from official vendor pricing"): Lambda 1x H100 SXM 3.78,
1x H100 PCIe 2.86, A100 40GB 1.48, A10 0.86; Modal A100 80GB 2.4984, L40S 1.9512, L4 0.7992, T4 0.5904.
Purchase, USD per GPU: H100 SXM ~30,000 and RTX 4090 1,800 ("Price (approx)", fridayswithfaraday.com
"Datacenter GPU vs consumer", H100 SXM vs RTX 4090 table); A100 80GB 8,000-15,000 refurbished/used
street price (mercatus-ai.com "A100 vs H100 vs H200", 2026): 11,500 taken (the middle).
Power: board power from the datasheets (H100 SXM 700 W, H100 PCIe 350 W, H200 700 W, A100 SXM 400 W,
L40S 350 W, L4 72 W, A10 150 W, T4 70 W, RTX 4090 450 W, RTX 3090 350 W, RTX A6000 300 W).
Electricity 0.13 USD/kWh: U.S. average commercial retail price, EIA Electric Power Monthly (2024, ~13 cents).
Life: 4 years of round-the-clock use (an assumption; `life_years=`); no cooling, hosting or resale counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import GpuwiseError
from ..catalog import lookup

PRICES_DATE = "2026-05-07"
RENT_USD_PER_HOUR = {"h100-sxm": 3.78, "h100-pcie": 2.86, "a100-40gb": 1.48, "a100-80gb": 2.4984, "l40s": 1.9512,
                     "l4": 0.7992, "t4": 0.5904, "a10": 0.86}
PURCHASE_USD = {"h100-sxm": 30000.0, "rtx-4090": 1800.0, "a100-80gb": 11500.0}
POWER_W = {"h100-sxm": 700, "h100-pcie": 350, "h200": 700, "a100-40gb": 400, "a100-80gb": 400, "l40s": 350,
           "l4": 72, "a10": 150, "t4": 70, "rtx-4090": 450, "rtx-3090": 350, "rtx-a6000": 300}
ELECTRICITY_USD_PER_KWH = 0.13
LIFE_YEARS = 4.0
HOURS_PER_YEAR = 365.25 * 24


@dataclass(frozen=True)
class TrainingCost:
    gpu: str
    nproc: int
    seconds: float
    gpu_hours: float
    rent_usd: float | None        # gpu_hours x rent price
    own_usd: float | None         # gpu_hours x (purchase / life hours + power x electricity)

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "nproc": self.nproc, "seconds": self.seconds, "gpu_hours": self.gpu_hours,
                "rent_usd": self.rent_usd, "own_usd": self.own_usd}


def parse_prices(items: list[str] | None) -> dict[str, float]:
    """`["H100=2.49", "l4=0.8"]` -> {catalog id: value}."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or price < 0:
            raise GpuwiseError(f"--price/--buy {item!r}: expected GPU=NUMBER, e.g. H100=2.49")
        out[lookup(name).id] = price
    return out


def training_cost(gpu_id: str, nproc: int, samples_per_s: float, total_samples: float,
                  rent: dict[str, float] | None = None, buy: dict[str, float] | None = None,
                  life_years: float = LIFE_YEARS, electricity_usd_per_kwh: float = ELECTRICITY_USD_PER_KWH,
                  ) -> TrainingCost:
    """Time and cost of `total_samples` at `samples_per_s` (all ranks) on `nproc` x `gpu_id`."""
    if samples_per_s <= 0:
        raise GpuwiseError("no predicted speed: cannot tell the training time")
    seconds = total_samples / samples_per_s
    gpu_hours = seconds / 3600 * nproc
    rent_price = {**RENT_USD_PER_HOUR, **(rent or {})}.get(gpu_id)
    purchase = {**PURCHASE_USD, **(buy or {})}.get(gpu_id)
    own = None
    if purchase is not None:
        per_hour = purchase / (life_years * HOURS_PER_YEAR) + POWER_W.get(gpu_id, 0) / 1000 * electricity_usd_per_kwh
        own = gpu_hours * per_hour
    return TrainingCost(gpu_id, nproc, seconds, gpu_hours, gpu_hours * rent_price if rent_price is not None else None,
                        own)
