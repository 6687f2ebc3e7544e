#!/usr/bin/env bash
# `make infra-test`: terraform init / apply / destroy of infra/ against a moto server on
# 127.0.0.1, fully offline. The hashicorp/aws provider comes from the filesystem mirror this
# machine keeps on disk (ORCH_TF_MIRROR, or found with `find`); nothing leaves 127.0.0.1.
#
# Steps: start moto on a free port -> copy infra/*.tf to a temp dir plus a provider override
# pointing at moto -> init -> apply -> check every resource in moto with boto3 -> plan shows no
# changes -> destroy -> check everything is gone -> stop moto, remove the temp dir.
# Exits non-zero on any failure.
#
# Environment: ORCH_TF_MIRROR (the provider mirror: <it>/<registry host>/hashicorp/aws/<version>),
# TERRAFORM (terraform binary), ORCH_PYTHON (python with moto and boto3; default .venv/bin/python),
# ORCH_INFRA_KEEP=1 keeps the temp dir for debugging.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${ORCH_PYTHON:-$ROOT/.venv/bin/python}
REGION=us-east-1
ZONES='["us-east-1a", "us-east-1b", "us-east-1c"]'
OWNER=orch-infra-test
SSH_CIDR=192.0.2.0/24 # TEST-NET-1: documentation addresses only
STORE=s3://orch-infra-test-ckpt/team/jobs # the nodes' role may touch this prefix only
# the jobs' bucket data and outputs: the nodes' roles may read and write these only
DATA_SOURCES='["s3://orch-infra-test-data/sets/imagenet", "s3://orch-infra-test-data/vocab.txt", "s3://orch-infra-test-all"]'
OUTPUT_DESTINATIONS='["s3://orch-infra-test-results/runs/"]'
START=$SECONDS

say() { echo "infra-test: $* [$((SECONDS - START))s]"; }
fail() {
    echo "infra-test: FAIL: $*" >&2
    exit 1
}

# --- preconditions: terraform, the provider mirror, python with moto + boto3 ----------------
TERRAFORM=${TERRAFORM:-$(command -v terraform || true)}
[ -n "$TERRAFORM" ] && [ -x "$TERRAFORM" ] ||
    fail "terraform not found on PATH (set TERRAFORM=/path/to/terraform); install Terraform >= 1.5"

find_mirror() {
    if [ -n "${ORCH_TF_MIRROR:-}" ]; then
        echo "$ORCH_TF_MIRROR"
        return
    fi
    local hit
    # A mirror is laid out <mirror>/<registry host>/hashicorp/aws/<version>/<platform>.
    hit=$(find / -maxdepth 6 \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
        -path '*/hashicorp/aws' -type d -print 2>/dev/null | head -n 1)
    [ -n "$hit" ] && dirname "$(dirname "$(dirname "$hit")")"
}
MIRROR=$(find_mirror || true)
[ -n "$MIRROR" ] ||
    fail "no Terraform provider mirror (<mirror>/<registry host>/hashicorp/aws) found under / (depth 6); set ORCH_TF_MIRROR to <mirror>"
[ -x "$PY" ] || fail "python not found at $PY (run 'make setup', or set ORCH_PYTHON)"
"$PY" -c 'import moto.server, boto3' 2>/dev/null ||
    fail "$PY cannot import moto.server and boto3 (run 'make setup': dev extra moto[server,ec2])"
read -r TF_VERSION TF_PLATFORM < <("$TERRAFORM" version -json 2>/dev/null |
    "$PY" -c 'import json,sys; v=json.load(sys.stdin); print(v["terraform_version"], v["platform"])') ||
    fail "'$TERRAFORM version -json' failed"
compgen -G "$MIRROR/*/hashicorp/aws/5.*/$TF_PLATFORM" >/dev/null ||
    fail "mirror $MIRROR has no hashicorp/aws/5.x/$TF_PLATFORM (the offline test needs the 5.x provider, e.g. 5.100.0, for this platform)"
say "terraform $TF_VERSION ($TF_PLATFORM), mirror $MIRROR"

# --- temp dir, cleanup ---------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/orch-infra-test.XXXXXX")
MOTO_PID=
cleanup() {
    local code=$?
    if [ -n "$MOTO_PID" ]; then
        if kill -0 "$MOTO_PID" 2>/dev/null; then
            kill "$MOTO_PID" 2>/dev/null || true
        elif [ "$code" -ne 0 ]; then
            echo "--- moto server died; its log (tail) ---" >&2
            tail -n 30 "$WORK/moto.log" >&2 || true
        fi
        wait "$MOTO_PID" 2>/dev/null || true
    fi
    if [ "${ORCH_INFRA_KEEP:-0}" = 1 ]; then
        echo "infra-test: kept $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- moto server on 127.0.0.1, a free port (the OS picks it) --------------------------------
"$PY" -u - "$WORK/moto.port" >"$WORK/moto.log" 2>&1 <<'PY' &
import os
import signal
import sys
import threading

from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
port = server.get_host_and_port()[1]
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(port))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
parent = os.getppid()
while not stop.wait(0.5) and os.getppid() == parent:  # also stop if the script was killed
    pass
server.stop()
PY
MOTO_PID=$!
for _ in $(seq 100); do
    [ -f "$WORK/moto.port" ] && break
    kill -0 "$MOTO_PID" 2>/dev/null || fail "moto server exited at start"
    sleep 0.1
done
[ -f "$WORK/moto.port" ] || fail "moto server did not start within 10 s"
PORT=$(cat "$WORK/moto.port")
ENDPOINT="http://127.0.0.1:$PORT"
say "moto server at $ENDPOINT (pid $MOTO_PID)"

# --- environment: offline, fake credentials, only 127.0.0.1 -----------------------------------
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_ROLE_ARN AWS_WEB_IDENTITY_TOKEN_FILE \
    AWS_ENDPOINT_URL AWS_ENDPOINT_URL_EC2 AWS_ENDPOINT_URL_STS AWS_ENDPOINT_URL_IAM \
    HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy \
    TF_PLUGIN_CACHE_DIR TF_DATA_DIR TF_WORKSPACE
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=$REGION
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$WORK/terraformrc"
cat >"$TF_CLI_CONFIG_FILE" <<EOF
provider_installation {
  filesystem_mirror {
    path    = "$MIRROR"
    include = ["hashicorp/aws"]
  }
  direct {
    exclude = ["hashicorp/aws"]
  }
}
EOF

# --- a copy of infra/ with a provider override pointing at moto ------------------------------
TF="$WORK/tf"
mkdir -p "$TF"
cp "$ROOT"/infra/*.tf "$TF"/
cp -r "$ROOT"/infra/policies "$TF"/
cat >"$TF/moto_override.tf" <<EOF
# Generated by scripts/infra_test.sh: the aws provider talks to moto on 127.0.0.1 only.
provider "aws" {
  access_key                  = "testing"
  secret_key                  = "testing"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_requesting_account_id  = true
  skip_region_validation      = true

  endpoints {
    ec2 = "$ENDPOINT"
    sts = "$ENDPOINT"
    iam = "$ENDPOINT"
  }
}
EOF
ssh-keygen -q -t ed25519 -N '' -C orch-infra-test -f "$WORK/id_ed25519" ||
    fail "ssh-keygen could not make a test key"
"$PY" - "$WORK/id_ed25519.pub" "$TF/test.tfvars.json" <<PY
import json, sys
json.dump({
    "region": "$REGION",
    "availability_zones": $ZONES,
    "owner": "$OWNER",
    "ssh_cidr_blocks": ["$SSH_CIDR"],
    "key_name": "orch-infra-test",
    "ssh_public_key": open(sys.argv[1]).read().strip(),
    "checkpoint_store": "$STORE",
    "data_sources": $DATA_SOURCES,
    "output_destinations": $OUTPUT_DESTINATIONS,
    "controller_host": True,
}, open(sys.argv[2], "w"), indent=2)
PY

tf() { "$TERRAFORM" -chdir="$TF" "$@"; }

"$TERRAFORM" -chdir="$ROOT/infra" fmt -check -diff -recursive ||
    fail "infra/ is not formatted: run 'terraform -chdir=infra fmt'"
tf init -no-color -input=false >"$WORK/init.log" 2>&1 || {
    cat "$WORK/init.log" >&2
    fail "terraform init (offline, mirror $MIRROR)"
}
say "init ok"

# --- apply, check ---------------------------------------------------------------------------
# SSH open to the whole internet is refused without the explicit opt-in.
if tf plan -no-color -input=false -var-file=test.tfvars.json -var 'ssh_cidr_blocks=["0.0.0.0/0"]' \
    >"$WORK/wide.log" 2>&1; then
    fail "plan with ssh_cidr_blocks = [\"0.0.0.0/0\"] was accepted without ssh_from_anywhere"
fi
grep -q "ssh_from_anywhere" "$WORK/wide.log" || { cat "$WORK/wide.log" >&2; fail "the refusal of 0.0.0.0/0 does not say how to opt in"; }
say "plan with SSH from 0.0.0.0/0: refused"

tf apply -no-color -input=false -auto-approve -var-file=test.tfvars.json >"$WORK/apply.log" 2>&1 || {
    cat "$WORK/apply.log" >&2
    fail "terraform apply"
}
say "apply ok ($(grep -c 'Creation complete' "$WORK/apply.log") resources created)"
tf output -no-color -json >"$WORK/outputs.json" || fail "terraform output"

check() { # check.py MODE: 'present' after apply, 'absent' after destroy
    "$PY" - "$1" "$ENDPOINT" "$REGION" "$WORK/outputs.json" "$WORK/test.expect.json" "$WORK/made.json" <<'PY'
import json
import sys
import urllib.parse

import boto3
from botocore.exceptions import ClientError

from tests.support.policy_templates import data_statements, node_job_policy

mode, endpoint, region, outputs_path, expect_path, ids_path = sys.argv[1:]
expect = json.load(open(expect_path))
ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=region,
                   aws_access_key_id="testing", aws_secret_access_key="testing")
iam = boto3.client("iam", endpoint_url=endpoint, region_name=region,
                   aws_access_key_id="testing", aws_secret_access_key="testing")
problems = []


def need(ok, what):
    if not ok:
        problems.append(what)


def tags(obj):
    return {t["Key"]: t["Value"] for t in obj.get("Tags", [])}


def owned(obj, what):
    need(tags(obj).get("orch-owner") == expect["owner"], f"{what} lacks tag orch-owner={expect['owner']}: {tags(obj)}")


def found(call, key, **kw):
    try:
        return call(**kw)[key]
    except ClientError as e:  # moto answers some lookups of deleted ids with NotFound
        if "NotFound" in e.response["Error"]["Code"]:
            return []
        raise


out = {k: v["value"] for k, v in json.load(open(outputs_path)).items()}
vpc_id, subnet_ids, sg_id, key_name = (out["vpc_id"], out["subnet_ids"], out["security_group_id"], out["key_name"])

if mode == "present":
    need(set(out) >= {"vpc_id", "subnet_ids", "security_group_id", "key_name"}, f"outputs missing: {sorted(out)}")
    vpcs = found(ec2.describe_vpcs, "Vpcs", VpcIds=[vpc_id])
    need(len(vpcs) == 1, f"vpc {vpc_id} not found")
    for vpc in vpcs:
        owned(vpc, "vpc")
        need(vpc["CidrBlock"] == expect["vpc_cidr"], f"vpc cidr {vpc['CidrBlock']}")
        dns = ec2.describe_vpc_attribute(VpcId=vpc_id, Attribute="enableDnsSupport")
        need(dns["EnableDnsSupport"]["Value"], "vpc enableDnsSupport is off")

    need(sorted(subnet_ids) == sorted(expect["zones"]), f"subnet_ids zones {sorted(subnet_ids)} != {expect['zones']}")
    subnets = found(ec2.describe_subnets, "Subnets", SubnetIds=list(subnet_ids.values()))
    need(len(subnets) == len(subnet_ids), f"{len(subnets)} of {len(subnet_ids)} subnets found")
    for s in subnets:
        zone = s["AvailabilityZone"]
        need(subnet_ids.get(zone) == s["SubnetId"], f"subnet {s['SubnetId']} is in {zone}, output says {subnet_ids}")
        need(s["VpcId"] == vpc_id, f"subnet {s['SubnetId']} not in the vpc")
        need(s["MapPublicIpOnLaunch"], f"subnet {s['SubnetId']} does not map public IPs")
        owned(s, f"subnet {zone}")
    need(len({s["CidrBlock"] for s in subnets}) == len(subnets), "subnet CIDRs overlap")

    igws = ec2.describe_internet_gateways(Filters=[{"Name": "attachment.vpc-id", "Values": [vpc_id]}])["InternetGateways"]
    need(len(igws) == 1, f"{len(igws)} internet gateways attached to the vpc")
    for igw in igws:
        owned(igw, "internet gateway")
    igw_ids = {g["InternetGatewayId"] for g in igws}
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["RouteTables"]
    public = [t for t in tables
              if any(r.get("DestinationCidrBlock") == "0.0.0.0/0" and r.get("GatewayId") in igw_ids for r in t["Routes"])]
    need(len(public) == 1, "no route table with 0.0.0.0/0 -> internet gateway")
    for t in public:
        owned(t, "route table")
        associated = {a.get("SubnetId") for a in t.get("Associations", [])}
        need(associated >= set(subnet_ids.values()), f"route table not associated with every subnet: {associated}")

    sgs = found(ec2.describe_security_groups, "SecurityGroups", GroupIds=[sg_id])
    need(len(sgs) == 1, f"security group {sg_id} not found")
    for sg in sgs:
        owned(sg, "security group")
        need(sg["VpcId"] == vpc_id, "security group not in the vpc")
        ingress = sg["IpPermissions"]
        ssh = [p for p in ingress if p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22 and p.get("ToPort") == 22]
        ssh_cidrs = {r["CidrIp"] for p in ssh for r in p.get("IpRanges", [])}
        need(ssh_cidrs == set(expect["ssh_cidrs"]), f"SSH ingress from {ssh_cidrs}, expected {expect['ssh_cidrs']}")
        wide = [r["CidrIp"] for p in ingress for r in p.get("IpRanges", []) if r["CidrIp"] == "0.0.0.0/0"]
        need(not wide, "ingress open to 0.0.0.0/0")
        selfref = [p for p in ingress if p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22
                   and p.get("ToPort") == 22
                   and any(g.get("GroupId") == sg_id for g in p.get("UserIdGroupPairs", []))]
        need(len(selfref) == 1, f"no SSH ingress from the group itself: {ingress}")
        everything = [p for p in ingress if p.get("IpProtocol") == "-1"]
        need(not everything, f"all traffic admitted into the nodes' group (jobs would reach each other): {everything}")
        egress_all = [p for p in sg["IpPermissionsEgress"] if p.get("IpProtocol") == "-1"
                      and any(r["CidrIp"] == "0.0.0.0/0" for r in p.get("IpRanges", []))]
        need(len(egress_all) == 1, "no all-traffic egress")
    rules = ec2.describe_security_group_rules(Filters=[{"Name": "group-id", "Values": [sg_id]}])["SecurityGroupRules"]
    need(len(rules) == 3, f"{len(rules)} security group rules, expected 3 (ssh, SSH between members, egress)")
    for rule in rules:
        owned(rule, f"security group rule {rule['SecurityGroupRuleId']}")

    profile = out.get("instance_profile", "")
    need(profile == "orch-node", f"instance_profile output {profile!r}, expected orch-node")
    roles = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"] if profile else []
    need(len(roles) == 1, f"instance profile holds {len(roles)} roles")
    for role in roles:
        assume = role["AssumeRolePolicyDocument"]
        assume = json.loads(urllib.parse.unquote(assume)) if isinstance(assume, str) else assume
        need(any(s.get("Principal", {}).get("Service") == "ec2.amazonaws.com" for s in assume["Statement"]),
             f"role {role['RoleName']} cannot be assumed by EC2: {assume}")
        document = iam.get_role_policy(RoleName=role["RoleName"], PolicyName="orch-checkpoint-store")["PolicyDocument"]
        document = json.loads(urllib.parse.unquote(document)) if isinstance(document, str) else document
        statements = document["Statement"]
        # pulls of a job's container image from Amazon ECR: read only, any repository
        ecr = [s for s in statements if s.get("Sid") == "PullImagesFromEcr"]
        ecr_actions = {"ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                       "ecr:BatchCheckLayerAvailability"}
        need(len(ecr) == 1 and set(ecr[0]["Action"]) == ecr_actions and ecr[0]["Resource"] in ("*", ["*"]),
             f"the node role's ECR statement is not the four pull actions on any repository: {ecr}")
        statements = [s for s in statements if s not in ecr]
        resources = {r for s in statements for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
        need(resources == {expect["store_objects"], expect["store_bucket_arn"]},
             f"the node role reaches {sorted(resources)}, expected only the store's prefix")
        actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        need(not any(a.endswith("*") for a in actions), f"wildcard actions for the nodes: {sorted(actions)}")
        listing = [s for s in statements if "s3:ListBucket" in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
        need(listing and all("s3:prefix" in json.dumps(s.get("Condition", {})) for s in listing),
             "the nodes may list the whole bucket, not only their prefix")
        # the jobs' bucket data and outputs: a policy of their own, as the tests render it
        document = iam.get_role_policy(RoleName=role["RoleName"], PolicyName="orch-data")["PolicyDocument"]
        document = json.loads(urllib.parse.unquote(document)) if isinstance(document, str) else document
        wanted = data_statements(expect["data_sources"], expect["output_destinations"])
        need(wanted and document["Statement"] == wanted,
             f"the nodes' data policy differs from infra/policies/node-data*.json.tftpl: {document}")

    # The policy of each job's own node role: its job's prefix only, named by the role's tag,
    # and the jobs' bucket data and outputs.
    job_policy = out.get("node_job_policy", "")
    need(job_policy.endswith(":policy/orch-node-job"), f"node_job_policy output {job_policy!r}")
    if job_policy:
        version = iam.get_policy(PolicyArn=job_policy)["Policy"]["DefaultVersionId"]
        applied = iam.get_policy_version(PolicyArn=job_policy, VersionId=version)["PolicyVersion"]["Document"]
        applied = json.loads(urllib.parse.unquote(applied)) if isinstance(applied, str) else applied
        wanted = node_job_policy(job_objects=expect["job_objects"], job_list_prefix=expect["job_list_prefix"],
                                 store_bucket_arn=expect["store_bucket_arn"], data_sources=expect["data_sources"],
                                 output_destinations=expect["output_destinations"])
        need(applied == wanted, f"the per-job node policy differs from infra/policies/node-*.json.tftpl: {applied}")

    # The controller host's role: every write only on orch-owner's instances, tagged at launch.
    host_profile = out.get("controller_instance_profile", "")
    need(host_profile == "orch-controller", f"controller_instance_profile output {host_profile!r}")
    host_roles = iam.get_instance_profile(InstanceProfileName=host_profile)["InstanceProfile"]["Roles"] if host_profile else []
    need(len(host_roles) == 1, f"the controller's instance profile holds {len(host_roles)} roles")
    for role in host_roles:
        document = iam.get_role_policy(RoleName=role["RoleName"], PolicyName="orch-controller")["PolicyDocument"]
        document = json.loads(urllib.parse.unquote(document)) if isinstance(document, str) else document
        by_sid = {s["Sid"]: s for s in document["Statement"]}
        listed = lambda v: [v] if isinstance(v, str) else list(v)  # noqa: E731
        # The very statements of infra/policies/ that the offline tests evaluate
        # (tests/support/policy_templates.py renders them as templatefile does).
        from tests.support.policy_templates import controller_policy
        vpc_arn = by_sid.get("OrchClusterGroupVpc", {}).get("Resource", "")
        need(vpc_arn.endswith(f":vpc/{vpc_id}"), f"cluster groups may be made outside the VPC: {vpc_arn!r}")
        node_role = iam.get_role(RoleName="orch-node")["Role"]["Arn"]
        rendered = controller_policy(owner=expect["owner"], vpc_arn=vpc_arn, store={
            "node_role_arn": node_role, "node_job_policy_arn": out.get("node_job_policy", ""),
            "store_objects": expect["store_objects"],
            "store_bucket_arn": expect["store_bucket_arn"], "store_list_prefix": expect["store_list_prefix"],
        })
        need(document["Statement"] == rendered["Statement"],
             f"the applied controller policy differs from infra/policies/ as the tests render it: {json.dumps(document)}")
        owner_is = {"StringEquals": {"aws:RequestTag/orch-owner": expect["owner"]}}
        need(by_sid["OrchLaunchTagged"].get("Condition") == owner_is,
             f"RunInstances of instances and volumes without the orch-owner tag: {by_sid['OrchLaunchTagged']}")
        need(set(listed(by_sid["OrchLaunchTagged"]["Resource"])) == {"arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"},
             "the tagged launch statement covers other resources")
        need(by_sid["OrchTagAtCreate"].get("Condition") == {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup"]}},
             f"CreateTags outside a launch: {by_sid['OrchTagAtCreate']}")
        own = by_sid["OrchEndOwnInstances"]
        need(listed(own["Action"]) == ["ec2:TerminateInstances"], f"instance writes: {own['Action']}")
        need(own.get("Condition") == {"StringEquals": {"aws:ResourceTag/orch-owner": expect["owner"]}},
             f"instance writes on instances not tagged orch-owner: {own}")
        every_action = {a for s in document["Statement"] for a in listed(s["Action"])}
        unused = every_action & {"ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute"}
        need(not unused, f"the controller role grants actions orch never calls: {sorted(unused)}")
        need(by_sid["OrchPassNodeRole"]["Resource"].endswith(":role/orch-node"),
             f"PassRole beyond the nodes' role: {by_sid['OrchPassNodeRole']}")
        need(listed(by_sid["OrchStoreCleanup"]["Resource"]) == [expect["store_objects"]],
             f"the controller reaches objects outside the store: {by_sid['OrchStoreCleanup']}")
        unconditioned = {a for s in document["Statement"] if "Condition" not in s
                         and s["Sid"] not in ("OrchStoreCleanup", "OrchLaunchUses", "OrchClusterGroupVpc")
                         and s["Resource"] != "arn:aws:iam::*:instance-profile/orch-node/*"
                         for a in listed(s["Action"])}
        need(all(a.split(":")[1].startswith(("Describe", "Get")) for a in unconditioned),
             f"writes that are not narrowed to orch's resources: {sorted(unconditioned)}")
        need(not any(a.endswith("*") for s in document["Statement"] for a in listed(s["Action"])),
             "wildcard actions for the controller host")

    keys = found(ec2.describe_key_pairs, "KeyPairs", KeyNames=[key_name])
    need(len(keys) == 1, f"key pair {key_name} not found")
    for key in keys:
        owned(key, "key pair")
        need(key.get("KeyType", "ed25519") == "ed25519", f"key type {key.get('KeyType')}")
else:
    need(not found(ec2.describe_vpcs, "Vpcs", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}]), f"vpc {vpc_id} still exists")
    need(not found(ec2.describe_subnets, "Subnets", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}]), "subnets still exist")
    need(not found(ec2.describe_security_groups, "SecurityGroups", Filters=[{"Name": "group-id", "Values": [sg_id]}]),
         f"security group {sg_id} still exists")
    need(not found(ec2.describe_key_pairs, "KeyPairs", Filters=[{"Name": "key-name", "Values": [key_name]}]),
         f"key pair {key_name} still exists")
    # (moto keeps the tags of deleted resources, so describe_tags cannot answer this: look up
    # every resource made by the apply by its id instead.)
    try:
        iam.get_instance_profile(InstanceProfileName=out.get("instance_profile") or "orch-node")
        need(False, "the nodes' instance profile still exists")
    except ClientError as e:
        need(e.response["Error"]["Code"] == "NoSuchEntity", f"instance profile lookup: {e}")
    try:
        iam.get_instance_profile(InstanceProfileName=out.get("controller_instance_profile") or "orch-controller")
        need(False, "the controller host's instance profile still exists")
    except ClientError as e:
        need(e.response["Error"]["Code"] == "NoSuchEntity", f"instance profile lookup: {e}")
    try:
        iam.get_policy(PolicyArn=out.get("node_job_policy") or "arn:aws:iam::123456789012:policy/orch-node-job")
        need(False, "the per-job node policy still exists")
    except ClientError as e:
        need(e.response["Error"]["Code"] == "NoSuchEntity", f"policy lookup: {e}")
    made = json.load(open(ids_path))
    need(not found(ec2.describe_route_tables, "RouteTables", Filters=[{"Name": "route-table-id", "Values": made["route_tables"]}]),
         f"route tables {made['route_tables']} still exist")
    need(not found(ec2.describe_internet_gateways, "InternetGateways",
                   Filters=[{"Name": "internet-gateway-id", "Values": made["internet_gateways"]}]),
         f"internet gateways {made['internet_gateways']} still exist")
    need(not found(ec2.describe_security_group_rules, "SecurityGroupRules", Filters=[{"Name": "group-id", "Values": [sg_id]}]),
         "security group rules still exist")

if mode == "present":
    json.dump({"route_tables": [t["RouteTableId"] for t in public], "internet_gateways": sorted(igw_ids)},
              open(ids_path, "w"))
for p in problems:
    print(f"  - {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
}
"$PY" - "$WORK/test.expect.json" <<PY
import json, sys
json.dump({"owner": "$OWNER", "zones": $ZONES, "ssh_cidrs": ["$SSH_CIDR"], "vpc_cidr": "10.42.0.0/16",
           "store_objects": "arn:aws:s3:::orch-infra-test-ckpt/team/jobs/*",
           "store_bucket_arn": "arn:aws:s3:::orch-infra-test-ckpt", "store_list_prefix": "team/jobs/*",
           "job_objects": "arn:aws:s3:::orch-infra-test-ckpt/team/jobs/\${aws:PrincipalTag/orch-job}/*",
           "job_list_prefix": "team/jobs/\${aws:PrincipalTag/orch-job}/*",
           "data_sources": $DATA_SOURCES, "output_destinations": $OUTPUT_DESTINATIONS},
          open(sys.argv[1], "w"))
PY
check present || fail "resources in moto after apply do not match (see above)"
say "resources checked in moto: vpc, subnets, internet gateway, route table, security group, key pair, node role and instance profile, controller role"

# A second plan must find nothing to change (the config round-trips through the API). One
# known moto quirk is tolerated: DescribeSecurityGroupRules answers a rule that references a
# group with "ACCOUNT/sg-..." and without its description, which real AWS does not.
tf plan -no-color -input=false -var-file=test.tfvars.json -out=after-apply.plan >"$WORK/plan.log" 2>&1 || {
    cat "$WORK/plan.log" >&2
    fail "terraform plan after apply"
}
tf show -no-color -json after-apply.plan >"$WORK/plan.json" || fail "terraform show plan"
"$PY" - "$WORK/plan.json" <<'PY' || { cat "$WORK/plan.log" >&2; fail "plan after apply wants changes (not idempotent)"; }
import json
import sys

plan = json.load(open(sys.argv[1]))
bad = []
for rc in plan.get("resource_changes", []):
    change = rc["change"]
    if change["actions"] in (["no-op"], ["read"]):
        continue
    before, after = change.get("before") or {}, change.get("after") or {}
    diff = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    ref_b, ref_a = before.get("referenced_security_group_id"), after.get("referenced_security_group_id")
    moto_quirk = (
        rc["type"] == "aws_vpc_security_group_ingress_rule"
        and change["actions"] == ["update"]
        and diff <= {"referenced_security_group_id", "description"}
        and (ref_b == ref_a or (ref_b or "").endswith("/" + (ref_a or "?")))
        and ("description" not in diff or not before.get("description"))
    )
    if not moto_quirk:
        bad.append(f"{rc['address']}: {change['actions']} {sorted(diff)}")
for b in bad:
    print(f"  - {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
say "plan after apply: no changes"

# --- destroy, check ---------------------------------------------------------------------------
tf destroy -no-color -input=false -auto-approve -var-file=test.tfvars.json >"$WORK/destroy.log" 2>&1 || {
    cat "$WORK/destroy.log" >&2
    fail "terraform destroy"
}
say "destroy ok"
check absent || fail "resources left in moto after destroy (see above)"
say "PASS: init, apply, checks, plan, destroy against moto on 127.0.0.1, offline"
