# The AWS network orch launches training nodes into:
#   one VPC, one public subnet per availability zone (nodes get public IPs for SSH from the
#   controller), an internet gateway with a default route, one security group (SSH from the
#   given CIDRs and between its members, all egress) and one key pair. The nodes of one cluster
#   reach each other on other ports through the cluster's own group, which orch makes in this
#   VPC at launch and deletes when the cluster ends.

data "aws_availability_zones" "available" {
  count = length(var.availability_zones) == 0 ? 1 : 0
  state = "available"
}

locals {
  zones = length(var.availability_zones) > 0 ? var.availability_zones : data.aws_availability_zones.available[0].names

  # Subnet CIDRs are fixed by the zone's position in the list: a /20 per zone inside the VPC,
  # or smaller when the VPC is too small to hold a /20 per zone.
  subnet_newbits = max(
    20 - tonumber(split("/", var.vpc_cidr)[1]),
    ceil(log(max(length(local.zones), 2), 2)),
  )

  tags = merge(var.tags, { "orch-owner" = var.owner })
}

resource "aws_vpc" "this" {
  cidr_block         = var.vpc_cidr
  enable_dns_support = true # private DNS names resolve; orch itself connects by IP

  tags = merge(local.tags, { Name = "${var.name}-vpc" })
}

resource "aws_subnet" "zone" {
  for_each = { for i, zone in local.zones : zone => i }

  vpc_id                  = aws_vpc.this.id
  availability_zone       = each.key
  cidr_block              = cidrsubnet(var.vpc_cidr, local.subnet_newbits, each.value)
  map_public_ip_on_launch = true

  tags = merge(local.tags, { Name = "${var.name}-${each.key}" })
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id

  tags = merge(local.tags, { Name = "${var.name}-igw" })
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this.id
  }

  tags = merge(local.tags, { Name = "${var.name}-public" })
}

resource "aws_route_table_association" "zone" {
  for_each = aws_subnet.zone

  subnet_id      = each.value.id
  route_table_id = aws_route_table.public.id
}

resource "aws_security_group" "nodes" {
  name        = "${var.name}-nodes"
  description = "orch training nodes: SSH from the controller and between members"
  vpc_id      = aws_vpc.this.id

  tags = merge(local.tags, { Name = "${var.name}-nodes" })
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  for_each = toset(var.ssh_cidr_blocks)

  security_group_id = aws_security_group.nodes.id
  description       = "SSH from the orch controller"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = each.value

  tags = merge(local.tags, { Name = "${var.name}-ssh" })

  lifecycle {
    precondition {
      condition     = var.ssh_from_anywhere || !endswith(each.value, "/0")
      error_message = "ssh_cidr_blocks holds ${each.value}, which lets anyone on the internet try to log into the nodes: give your own address, e.g. [\"203.0.113.7/32\"], or set ssh_from_anywhere = true if that is really meant."
    }
  }
}

# SSH only between members: the controller host, a member, reaches the nodes at their private
# addresses. torchrun's rendezvous, NCCL and gloo (ports chosen at run time, unauthenticated)
# reach only the nodes of the same cluster, through the cluster's own group that orch makes;
# never another job's nodes or the host.
resource "aws_vpc_security_group_ingress_rule" "intra_group" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "SSH between orch nodes and the controller host"
  ip_protocol                  = "tcp"
  from_port                    = 22
  to_port                      = 22
  referenced_security_group_id = aws_security_group.nodes.id

  tags = merge(local.tags, { Name = "${var.name}-intra-group" })
}

resource "aws_vpc_security_group_egress_rule" "all" {
  security_group_id = aws_security_group.nodes.id
  description       = "All outbound (package installs, data downloads)"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"

  tags = merge(local.tags, { Name = "${var.name}-egress" })
}

resource "aws_key_pair" "orch" {
  key_name   = var.key_name
  public_key = trimspace(var.ssh_public_key)

  tags = merge(local.tags, { Name = var.key_name })
}
