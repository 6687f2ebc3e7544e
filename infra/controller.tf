# The controller host's own credentials (`orch controller up --provider aws`): a role that may
# launch, tag and end only orch-tagged instances, and make and delete its clusters' security
# groups, in an instance profile that orch attaches to the host. The user's keys never go to
# the host. Made only when `controller_host` is true.

locals {
  with_controller = var.controller_host ? 1 : 0
  # The policy's statements live in policies/*.json.tftpl, where the offline tests read and
  # evaluate them against the API calls orch makes (tests/integration/test_aws_iam_calls.py).
  # With a checkpoint store: the nodes' shared role may be passed to the nodes, each job's own
  # role made, passed and deleted (under /orch-node/, with the per-job policy only), and the
  # store's prefix listed and pruned (the controller deletes versions no rule keeps).
  controller_policies = concat(
    [templatefile("${path.module}/policies/controller.json.tftpl", {
      owner   = var.owner
      vpc_arn = aws_vpc.this.arn
    })],
    local.with_store == 1 ? [templatefile("${path.module}/policies/controller-store.json.tftpl", {
      node_role_arn       = one(aws_iam_role.node[*].arn)
      node_job_policy_arn = one(aws_iam_policy.node_job[*].arn)
      owner               = var.owner
      store_objects       = local.store_objects
      store_bucket_arn    = "arn:aws:s3:::${local.store_bucket}"
      store_list_prefix   = local.store_prefix == "" ? "*" : "${local.store_prefix}/*"
    })] : [],
  )
}

data "aws_iam_policy_document" "controller_assume" {
  count = local.with_controller

  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "controller" {
  count = local.with_controller

  name               = "${var.name}-controller"
  description        = "orch controller host: launch, tag and end orch-owner=${var.owner} instances and their cluster groups only"
  assume_role_policy = data.aws_iam_policy_document.controller_assume[0].json

  tags = merge(local.tags, { Name = "${var.name}-controller" })
}

resource "aws_iam_role_policy" "controller" {
  count = local.with_controller

  name = "${var.name}-controller"
  role = aws_iam_role.controller[0].id
  policy = jsonencode({
    Version   = "2012-10-17"
    Statement = flatten([for doc in local.controller_policies : jsondecode(doc).Statement])
  })
}

resource "aws_iam_instance_profile" "controller" {
  count = local.with_controller

  name = "${var.name}-controller"
  role = aws_iam_role.controller[0].name

  tags = merge(local.tags, { Name = "${var.name}-controller" })
}
