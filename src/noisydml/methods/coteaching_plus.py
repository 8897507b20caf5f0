"""``coteaching_plus``: Co-teaching+ (Yu et al., ICML 2019): Co-teaching's small-loss exchange restricted to the
samples on which the two networks' predictions disagree (Algorithm 1, step 4), after ``disagreement_from_epoch``
epochs of plain Co-teaching; the algorithm is in :mod:`noisydml.methods.parts.coteaching`."""

from noisydml.methods.base import MethodSpec
from noisydml.methods.parts.coteaching import COTEACHING_FIELDS, CoTeaching
from noisydml.schema import Field


class CoTeachingPlus(CoTeaching):
    disagreement = True


SPEC = MethodSpec(
    build=CoTeachingPlus,
    schema={**COTEACHING_FIELDS,
            "disagreement_from_epoch": Field(
                int, 1, min=0,
                help="epochs of plain Co-teaching before the disagreement rule (the authors' code: init_epoch, 20 "
                     "of 200 on CIFAR; the paper's Algorithm 1 from the start; ours: 1 of the default 12, about "
                     "the code's share)")},
    description="Co-teaching+ (Yu et al. 2019): the small-loss exchange on disagreeing predictions",
)
