"""The policy pack for a real preview: pulumi preview --policy-pack policies"""

from pulumi_policy import PolicyPack

from policies.rules import POLICIES

PolicyPack(name="training-platform", policies=POLICIES)
