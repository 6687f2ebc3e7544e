# The controller host's own credentials (`orch controller up --provider aws`): a role that may
# launch, tag and end only orch-tagged instances, in an instance profile that orch attaches to
# the host. The user's keys never go to the host. Made only when `controller_host` is true.

locals {
  with_controller = var.controller_host ? 1 : 0
  # The instances and volumes a launch creates: tagged `orch-owner = var.owner` in the request.
  launched = ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"]
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

data "aws_iam_policy_document" "controller" {
  count = local.with_controller

  # Reads EC2 cannot narrow to resources (offers, images, network, instance states), and prices.
  statement {
    sid = "OrchReads"
    actions = [
      "ec2:DescribeInstances", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
      "ec2:DescribeSpotPriceHistory", "ec2:DescribeImages", "ec2:DescribeKeyPairs",
      "ec2:DescribeVpcs", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
      "ec2:DescribeSecurityGroupRules", "ec2:DescribeAvailabilityZones", "pricing:GetProducts",
    ]
    resources = ["*"]
  }

  statement {
    sid       = "OrchLaunchTagged"
    actions   = ["ec2:RunInstances"]
    resources = local.launched
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/orch-owner"
      values   = [var.owner]
    }
  }

  # What a launch uses without creating it: no tag to ask for.
  statement {
    sid     = "OrchLaunchUses"
    actions = ["ec2:RunInstances"]
    resources = [
      "arn:aws:ec2:*::image/*", "arn:aws:ec2:*:*:subnet/*", "arn:aws:ec2:*:*:network-interface/*",
      "arn:aws:ec2:*:*:security-group/*", "arn:aws:ec2:*:*:key-pair/*",
      "arn:aws:ec2:*:*:spot-instances-request/*",
    ]
  }

  statement {
    sid       = "OrchTagAtLaunch"
    actions   = ["ec2:CreateTags"]
    resources = local.launched
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  statement {
    sid = "OrchOwnInstances"
    actions = [
      "ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances",
      "ec2:ModifyInstanceAttribute",
    ]
    resources = ["arn:aws:ec2:*:*:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/orch-owner"
      values   = [var.owner]
    }
  }

  statement {
    sid       = "OrchIdentity"
    actions   = ["sts:GetCallerIdentity"]
    resources = ["*"]
  }

  # With a checkpoint store: the nodes' role may be passed to the nodes, and the store's prefix
  # read, written and pruned (the controller deletes versions no rule keeps).
  dynamic "statement" {
    for_each = local.with_store == 1 ? [1] : []
    content {
      sid       = "OrchPassNodeRole"
      actions   = ["iam:PassRole"]
      resources = [aws_iam_role.node[0].arn]
      condition {
        test     = "StringEquals"
        variable = "iam:PassedToService"
        values   = ["ec2.amazonaws.com"]
      }
    }
  }

  dynamic "statement" {
    for_each = local.with_store == 1 ? [1] : []
    content {
      sid       = "OrchStoreObjects"
      actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
      resources = [local.store_objects]
    }
  }

  dynamic "statement" {
    for_each = local.with_store == 1 ? [1] : []
    content {
      sid       = "OrchStoreList"
      actions   = ["s3:ListBucket"]
      resources = ["arn:aws:s3:::${local.store_bucket}"]
      condition {
        test     = "StringLike"
        variable = "s3:prefix"
        values   = [local.store_prefix == "" ? "*" : "${local.store_prefix}/*"]
      }
    }
  }
}

resource "aws_iam_role" "controller" {
  count = local.with_controller

  name               = "${var.name}-controller"
  description        = "orch controller host: launch, tag and end orch-owner=${var.owner} instances only"
  assume_role_policy = data.aws_iam_policy_document.controller_assume[0].json

  tags = merge(local.tags, { Name = "${var.name}-controller" })
}

resource "aws_iam_role_policy" "controller" {
  count = local.with_controller

  name   = "${var.name}-controller"
  role   = aws_iam_role.controller[0].id
  policy = data.aws_iam_policy_document.controller[0].json
}

resource "aws_iam_instance_profile" "controller" {
  count = local.with_controller

  name = "${var.name}-controller"
  role = aws_iam_role.controller[0].name

  tags = merge(local.tags, { Name = "${var.name}-controller" })
}
